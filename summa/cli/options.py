"""The ``options`` command: the settings in effect (the given ones, then those
at their defaults), or the table of every setting (docs/options.md)."""

from __future__ import annotations

from .. import options as settings

__all__ = ["add_parser", "run", "settings_text"]


def add_parser(sub) -> None:
    """``options``: the settings in effect."""
    opts = sub.add_parser("options", help="the settings (SUMMA_* variables) in effect",
                          description="Print the settings given as VARIABLE=value, "
                                      "then those at their defaults (marked), or with "
                                      "--markdown the table of every setting "
                                      "(docs/options.md).")
    opts.add_argument("--markdown", action="store_true",
                      help="docs/options.md: the table of every setting")
    opts.add_argument("--internal", action="store_true",
                      help="the settings tests and the pool use, too")


def settings_text(internal: bool) -> str:
    """``summa options``: the settings given, as VARIABLE=value, then those at
    their defaults, marked so (all of them where none was given)."""
    chosen = settings.current().variables(internal=internal)
    lines = [f"{k}={v}" for k, v in chosen.items()]
    lines.append("# at their defaults (docs/options.md says what each sets):")
    lines += [f"# {k}={v}" if v is not None else f"# {k} (chosen at run time)"
              for k, v in settings.defaults(internal).items() if k not in chosen]
    return "\n".join(lines) + "\n"


def run(args, out) -> int:
    """Print the settings, or with ``--markdown`` the table of every one."""
    out.write(settings.document() if args.markdown else settings_text(args.internal))
    return 0
