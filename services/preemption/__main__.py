from corral.services.preemption.service import Preemption
from corral.services.runtime import main

main(Preemption)
