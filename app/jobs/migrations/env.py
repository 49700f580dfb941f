"""Alembic's environment for the jobs database: it runs on the connection `app.jobs.migrations.migrate`
hands it (``config.attributes["connection"]``), inside that connection's transaction."""

from alembic import context

context.configure(connection=context.config.attributes["connection"])
with context.begin_transaction():  # the caller's transaction is already open: this one commits nothing
    context.run_migrations()
