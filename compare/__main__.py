"""``python -m compare``: the signal handlers first (``compare.run.stop``: SIGINT and SIGTERM only set a flag, also
while the rest of the tool and the frameworks load), then the command line; once it has returned, signals are
ignored while the interpreter shuts down."""

from compare.run import stop

stop.install()

from compare.cli.main import main  # noqa: E402 (after the handlers: a signal during these imports must not raise)

status = main()
stop.ignore_from_now()
raise SystemExit(status)
