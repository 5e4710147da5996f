from corral.services.placement.service import Placement
from corral.services.runtime import main

main(Placement)
