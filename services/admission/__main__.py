from corral.services.admission.service import Admission
from corral.services.runtime import main

main(Admission)
