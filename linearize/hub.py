"""Whether the Hugging Face Hub can be reached now, asked once and quickly: a mistyped id on an offline machine
would otherwise wait ~30 s through huggingface_hub's five retries before its error."""

from __future__ import annotations

import contextlib
import os
import socket
from urllib.parse import urlparse

#: a proxy set in the environment: the Hub is reached through it, so a direct connection says nothing
PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(repo_id=None, timeout=3.0):
    """Why the Hub cannot serve now (a short reason), or None when it may: offline mode is set (the libraries
    then fail or use their cache at once), ``repo_id``'s config (a model repository) is in the local cache, a
    proxy is set (not probed), or a TCP connection to the endpoint opens within ``timeout`` seconds."""
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(proxy) for proxy in PROXIES):
        return None
    try:
        if repo_id is not None and huggingface_hub.try_to_load_from_cache(repo_id, "config.json") is not None:
            return None
    except ValueError:  # not a valid repo id: transformers says so itself
        return None
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as error:
        return f"{url.hostname}:{port}: {error.strerror or error}"
    return None


def failure_reason(error, unreachable):
    """The one-line reason a Hub load failed: the Hub unreachable (``unreachable``, what
    :func:`offline_while_unreachable` yielded) and the data not cached, or the first line of ``error``."""
    if unreachable is not None:
        return f"the Hub is unreachable ({unreachable}) and the data set is not in the local cache"
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


@contextlib.contextmanager
def offline_while_unreachable():
    """``datasets`` and ``huggingface_hub`` in offline mode inside the block when the Hub is unreachable
    (:func:`hub_unreachable`): a data set in the local cache loads from it at once, one that is not fails at
    once (``OfflineModeIsEnabled``), instead of after the retries. Yields the reason, or None (nothing changed)."""
    reason = hub_unreachable()
    if reason is None:
        yield None
        return
    import datasets
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield reason
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = before
