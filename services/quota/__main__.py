from corral.services.quota.service import Quota
from corral.services.runtime import main

main(Quota)
