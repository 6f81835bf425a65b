"""Alembic's environment for the framework's own tables (run by mega.runtime.migrate).

The connection comes from the caller (`config.attributes["connection"]`); the version is kept in
`mega_alembic_version`, so that an application's own Alembic history (`alembic_version`) lives
beside it in the same database without a clash.
"""

from alembic import context

from mega.runtime.migrate import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
