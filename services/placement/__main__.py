from corral.services.main import main
from corral.services.placement.service import Placement

main(Placement)
