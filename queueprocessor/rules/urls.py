"""Database URLs as text: the default farm's, and any URL (a database's, an HTTP job's) made safe to show. No
SQLAlchemy here: every command names its database (or masks it in an error) before it loads the engine, and
`--help` loads none.
"""

import re
from pathlib import Path

# From "user:" to the last "@": people type passwords with spaces, "@" and "/" in them unencoded, and a
# mask that shows too much is worse than one that hides a host name too.
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:).*@", re.DOTALL)
# The same in a URL that does not parse (postgresql//u:pw@h, postgresql:/u:pw@h, u:pw@h): from the user's
# ":" to the last "@", the scheme, if any, and the user kept.
_PASSWORD_IN_TEXT = re.compile(r"((?:^|(?<=[\s'\"(=]))(?:[A-Za-z][\w+.-]*)?:?/*[^:/@\s'\"]*:)(?!//|\s).*@", re.DOTALL)
# password=... or pwd=... in a query string or an ODBC connection string, plain or URL-encoded, past any
# {braces}: after a plain "=" to the next ";" or the end ("&" may be the password's own in a connection
# string, and "%3B" is a URL-encoded password's own ";"); after an encoded "%3D" (an ODBC connection string
# inside a URL) to the next "%3B" or ";".
_PASSWORD_PARAM = re.compile(
    r"((?:password|pwd)=)(?:\{[^}]*\}?)?[^;]*"
    r"|((?:password|pwd)%3D)(?:%7B.*?(?:%7D|$))?(?:(?!%3B)[^;])*",
    re.IGNORECASE,
)

HTTP_SCHEMES = ("http", "https")  # the schemes of a URL an HTTP job or a node's HTTP base may name
# An HTTP URL's whole userinfo ("https://TOKEN@host" is as secret as "https://user:password@host").
_USERINFO_IN_HTTP = re.compile(r"(https?://)[^/?#@\s]+@", re.IGNORECASE)
# A query parameter that looks secret, by its name (or its name's last word: client_secret, X-Amz-Signature,
# refresh_token), its value up to the next parameter, fragment, space or quote. A harmless one hidden (order_key)
# costs less than a secret shown.
SECRET_NAMES = (
    "token",
    "key",
    "api_key",
    "apikey",
    "secret",
    "password",
    "passwd",
    "pwd",
    "sig",
    "signature",
    "access_token",
    "auth",
)
_SECRET_PARAM = re.compile(rf"([?&;](?:[\w.~%-]*[_.-])?(?:{'|'.join(SECRET_NAMES)})=)[^&;#\s'\"]*", re.IGNORECASE)


def default_url(file: str = "farm.db") -> str:
    """The embedded default: one SQLite file in the user's data directory (made by the first writer). Only
    a command given no database asks for it, so platformdirs is loaded then (a node spares its memory)."""
    import platformdirs

    return f"sqlite:///{Path(platformdirs.user_data_dir('queueprocessor')) / file}"


def mask(url: object) -> str:
    """The URL (text or a SQLAlchemy URL), or a message that holds one, with its secrets replaced by ***, safe to
    log, show or store: a password (in the URL or a parameter), an HTTP URL's userinfo, secret-looking query
    parameters (SECRET_NAMES)."""
    text = url.render_as_string(hide_password=True) if hasattr(url, "render_as_string") else str(url)
    # First: an "@" in such a password is no user's "@".
    text = _PASSWORD_PARAM.sub(lambda m: (m[1] or m[2]) + "***", text)
    text = _PASSWORD_IN_TEXT.sub(r"\1***@", _PASSWORD_IN_URL.sub(r"\1***@", text))
    return _SECRET_PARAM.sub(r"\1***", _USERINFO_IN_HTTP.sub(r"\1***@", text))
