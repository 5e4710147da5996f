from corral.services.main import main
from corral.services.preemption.service import Preemption

main(Preemption)
