from corral.services.main import main
from corral.services.quota.service import Quota

main(Quota)
