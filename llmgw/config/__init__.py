"""Configuration as data, on the ground floor: the environment's table (``environment``), the
providers file's specs (``providers_file``, ``prices``, ``kinds``) and the one strict converter
(``converter``), read once into one frozen :class:`Settings` (a reload builds a whole new one).

It imports no other llmgw package: a provider kind's own keys reach it through the plugin
registry (the ``llmgw.providers`` entry points, ``kinds``), not through ``llmgw.providers``.
"""

from llmgw.config.environment import (
    DEFAULT_MAX_CONNECTIONS,
    ENVIRONMENT_VARIABLES,
    MAX_WORKERS,
    MOST_CONNECTIONS,
    ConfigError,
    EnvVar,
    Settings,
    load_bind_addr,
    load_settings,
    parse_bool,
    parse_workers,
    venice_provider,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "ENVIRONMENT_VARIABLES",
    "MAX_WORKERS",
    "MOST_CONNECTIONS",
    "ConfigError",
    "EnvVar",
    "Settings",
    "load_bind_addr",
    "load_settings",
    "parse_bool",
    "parse_workers",
    "venice_provider",
]
