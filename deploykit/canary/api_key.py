"""The canary's API key from a file (`--api-key-file`): a Kubernetes Secret mounted as a volume, which the
kubelet updates in place when the Secret changes. Read before every run, so a key rotated under a running
canary is picked up at its next run, where a key in an environment variable stays what it was when the
container started (the two containers of a pod then disagree until one restarts: issue 34).
"""

from __future__ import annotations

from deploykit.errors import CanaryError

KEY_FILE_MAX_BYTES = 4096
"""An API key is tens of bytes; a bigger file is not one."""


def read_api_key_file(path: str) -> str:
    """The key in `path`, one trailing line break dropped (what `kubectl create secret --from-file` keeps);
    a CanaryError (one line, never the value) when it is missing, empty, too big, or not header-safe."""
    from deploykit.net import SecretRefused, secret_from_env

    try:
        with open(path, "rb") as handle:
            data = handle.read(KEY_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise CanaryError(f"the API key file {path} cannot be read ({exc.strerror or exc})") from None
    if len(data) > KEY_FILE_MAX_BYTES:
        raise CanaryError(f"the API key file {path} is over {KEY_FILE_MAX_BYTES} bytes: not an API key")
    try:
        text = data.decode("ascii").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError:
        raise CanaryError(
            f"the API key file {path} holds a non-ASCII byte, which an HTTP header cannot carry; its value "
            "is not shown"
        ) from None
    try:
        key = secret_from_env("key", {"key": text}, what=f"API key file {path}")
    except SecretRefused as exc:
        raise CanaryError(str(exc).replace("variable key ", "")) from None
    if key is None:
        raise CanaryError(f"the API key file {path} is empty")
    return key
