"""Every name, prefix and default the framework shares, each with the reason for its value."""

from __future__ import annotations

# Used only under `mega dev` (MEGA_ENV=dev); outside dev a real MEGA_SECRET_KEY is required.
DEV_SECRET_KEY = "mega-dev-only-secret-key-do-not-use-in-production"
# HMAC-SHA256 keys shorter than this are guessable in practice.
MIN_SECRET_KEY_LENGTH = 32

# Cookies: the session cookie carries only a random session id (signed); the anonymous CSRF
# cookie backs the login form before any session exists (signed double-submit).
SESSION_COOKIE = "mega_session"
ANON_CSRF_COOKIE = "mega_csrf"
# A one-time message for the next page (post, redirect, get), signed; see mega.web.pages.flash.
FLASH_COOKIE = "mega_flash"
# Left by a successful login and kept at logout: the signed username and its time of issue.
# A browser carrying it is exempt from that account's limit on failed logins (mega.web.limits).
DEVICE_COOKIE = "mega_device"
CSRF_FORM_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"

# Boot: how long a host waits for NATS, Redis and the database before it gives up with one line.
CONNECT_TIMEOUT_S = 3.0
# /readyz: a dependency that does not answer within this is reported down.
READY_CHECK_TIMEOUT_S = 1.0
# Connections one Redis client keeps at most; more concurrent calls wait for a free one.
REDIS_MAX_CONNECTIONS = 64
# Connections a Redis Cluster client opens at most to each node. redis-py's cluster client has no
# pool to wait on: a call beyond them fails (300 XADDs gathered at once failed at 64), so this
# is a ceiling for bursts, kept well above them, not a queue.
REDIS_CLUSTER_MAX_CONNECTIONS = 1000
# How long a durable job's enqueue waits for a replica to confirm it has the job (Redis WAIT):
# a replica in sync answers in about a round trip, so a second means it is lagging or gone.
# Kept under the clients' socket timeout (CONNECT_TIMEOUT_S), which would cut the WAIT short.
REDIS_DURABLE_WAIT_S = 1.0
# NATS clients reconnect forever (an outage is not a crash) at this pace.
NATS_RECONNECT_WAIT_S = 0.5
# A NATS client pings its server this often and gives the connection up when more than this
# many pings go unanswered: a partitioned or frozen server is left 2 to 3 s after it went silent
# (nats-py's own defaults, 120 s and 2, would take minutes), and the client moves to another
# node, in time to be moving again within 5 s of the fault.
NATS_PING_INTERVAL_S = 1
NATS_MAX_OUTSTANDING_PINGS = 2

# What a graceful stop waits for in-flight work before leaving it to redelivery (hosts).
DRAIN_TIMEOUT_S = 30.0

# Where `mega dev` keeps embedded server data, the SQLite database and logs.
VAR_DIR = "var"
# While `mega dev` runs, the URLs of its embedded servers, for hosts started by hand beside it
# (under VAR_DIR, beside the config; read when those variables are unset).
DEV_ENV_FILE = "dev.env"
DEV_ENV_NAMES = ("NATS_URL", "REDIS_URL", "DATABASE_URL")

# Bus drivers: the built-in ones by name ("module:class", imported on first use), and the
# entry-point group through which a package adds one (see mega.drivers).
BUILT_IN_DRIVERS = {
    "nats": "mega.drivers.nats:NatsBus",
    "redis": "mega.drivers.redis:RedisBus",
    "memory": "mega.drivers.memory:MemoryBus",
    "postgres": "mega.drivers.postgres:PostgresBus",
}
DRIVERS_ENTRY_POINT_GROUP = "mega.drivers"

# Fix-it hint appended to every "cannot reach" message.
HOW_TO_GET_SERVICES = "run `mega dev` (embedded servers) or `docker compose up`"

# How long a bus's close waits for its own tasks (a wake-up watch, the last announcements).
CLOSE_TASKS_S = 2.0
