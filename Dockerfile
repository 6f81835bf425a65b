# The app image: one image, three roles (compose picks the command: start, scheduler, worker).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid, so volume permissions are predictable; the app never runs as root.
RUN useradd --create-home --uid 10001 --user-group mega
WORKDIR /app

# Dependencies first, from pyproject.toml alone: this layer is rebuilt only when the dependency
# list changes, not on every source edit. The framework's, the sample's (the web side and its
# guide), and the postgres extra for compose's PostgreSQL.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; o = p['optional-dependencies']; print('\n'.join(r for r in p['dependencies'] + o['sample'] + o['web'] + o['postgres'] if not r.startswith('mega-py')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the source, and the package itself without deps (they are in the layer above). Editable,
# because the sample finds templates/ and static/ next to app/, not in site-packages. Compiled
# here: PYTHONDONTWRITEBYTECODE keeps a container from writing bytecode, so without it every
# mega process would compile the framework and the app again as it starts.
COPY . .
RUN pip install --no-deps -e . \
    && python -m compileall -q mega app mega_config.py \
    && mkdir -p /app/var \
    && chown mega:mega /app/var

USER mega

EXPOSE 8000

# /healthz: the process answers (compose checks /readyz, which also needs NATS, Redis and the DB).
# Python, because the slim image has no curl. Compose replaces it for the scheduler and worker.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

CMD ["mega", "start", "--host", "0.0.0.0", "--port", "8000"]
