"""The config file: a TOML table per command (and a top-level `db`) becomes click's defaults, each key checked
against the command's options and each value against the option's type, so a typo is refused, not ignored."""

from typing import Any

import click

from ..nodeoptions import Seconds
from ..rules.errors import ConfigError, echoed


def load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import tomllib  # only with a config file

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist: check the --config path or QP_CONFIG") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    except (OSError, UnicodeDecodeError) as error:  # a folder, no permission, not text
        raise ConfigError(f"cannot read config file {path}: {getattr(error, 'strerror', None) or error}") from None


def check_config_keys(group: click.Group, config: dict[str, Any], path: str | None, prefix: str = "") -> dict[str, Any]:
    """The config's tables become Click's default_map; unknown keys are refused, not ignored."""
    defaults = {}
    for key, value in config.items():
        if key == "db" and not prefix:
            continue
        command = group.commands.get(key)
        if command is None or not isinstance(value, dict):
            raise ConfigError(
                f"config file {path}: unknown key {echoed(prefix + key)}: use 'db' or a table named after "
                f"a command ({', '.join(sorted(group.commands))})"
            )
        if isinstance(command, click.Group):
            defaults[key] = check_config_keys(command, value, path, prefix=f"{prefix}{key}.")
            continue
        # An option is named by its flag (allow-host) or its parameter (allow_hosts).
        params = {
            name: p
            for p in command.params
            for name in (p.name, *(flag.lstrip("-").replace("-", "_") for flag in p.opts))
        }
        defaults[key] = {}
        for option, given in value.items():
            param = params.get(option.replace("-", "_"))
            if param is None:
                raise ConfigError(
                    f"config file {path}: [{prefix}{key}] has no option {echoed(option)}: "
                    f"see `queueprocessor {(prefix + key).replace('.', ' ')} --help`"
                )
            defaults[key][param.name] = _typed(param, given, f"config file {path}: [{prefix}{key}] {option}")
    return defaults


def _typed(param: click.Parameter, value: object, where: str) -> object:
    """TOML has types of its own: click would turn true into 1, 1.5 into 1 and [1] into "[1]", or fail with a
    traceback on a table or a date. Each value must be of the option's type; a repeatable option takes a list
    of them or one."""
    kind = param.type
    wanted: tuple[type, ...]
    if isinstance(kind, click.types.BoolParamType):
        wanted, text = (bool,), "true or false"
    elif isinstance(kind, click.types.IntParamType):
        wanted, text = (int,), "a whole number"
    elif isinstance(kind, click.types.FloatParamType):
        wanted, text = (int, float), "a number of seconds" if isinstance(kind, Seconds) else "a number"
    else:
        wanted, text = (str,), "a string in quotes"
    repeats = param.multiple or param.nargs != 1
    items = value if repeats and isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, wanted) or (isinstance(item, bool) and bool not in wanted):
            shown = str(item).lower() if isinstance(item, bool) else echoed(item)
            raise ConfigError(f"{where} must be {text}{', or a list of them' if repeats else ''} (got {shown})")
    return items if repeats else value
