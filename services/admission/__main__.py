from corral.services.admission.service import Admission
from corral.services.main import main

main(Admission)
