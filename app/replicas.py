"""How many copies of each stream the sample asks for in a NATS cluster: MEGA_REPLICAS (1 by
default, 3 on docker-compose's cluster profile). One node keeps one copy; three survive the loss
of one node."""

import os

REPLICAS = int(os.environ.get("MEGA_REPLICAS") or 1)
