"""The sample as an ASGI app for any server: `uvicorn app.asgi:app` serves what `mega start`
serves (the config from $MEGA_CONFIG or ./mega_config.py, read at startup)."""

from mega.runtime import asgi_app

app = asgi_app()
