"""Per-provider settings for outbound HTTP: ``DURABLE_HTTP_PROVIDERS`` with sane defaults.

A *provider* is a remote service as far as limits go (an API, a webhook
receiver). Every key is optional; a provider nobody configured gets the
defaults, and ``DURABLE_HTTP_PROVIDERS["default"]`` (if present) overrides the
defaults for every provider. ``DURABLE_HTTP_ALLOW_HOSTS`` adds allow-listed
hosts to every provider. docs/how-to/outbound-http.md, "Outbound HTTP", lists every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .policy import DEFAULT_MAX_RETRY_AFTER


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    base_url: str = ""
    connect_timeout: float = 5.0
    # The whole exchange — DNS, connect, TLS, upload, headers, body — must end by then.
    total_timeout: float = 30.0
    max_body_bytes: int = 1024 * 1024
    max_in_flight: int = 8  # 0: no limit
    min_spacing_ms: int = 0  # between request starts, across all workers; 0: none
    gate_retry_seconds: float = 1.0  # a unit turned away by a full gate retries about this later
    allow_hosts: tuple[str, ...] = ()
    follow_redirects: bool = False
    max_redirects: int = 5
    backoff_base: float = 2.0
    backoff_max: float = 300.0
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    verify: bool | str = True  # or the path of a CA bundle
    headers: dict[str, str] = field(default_factory=dict)
    auth_credential: str = ""  # credential reference whose value authenticates every request
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"  # "" sends the credential as the header's whole value
    user_agent: str = "durable-http/1"

    @property
    def gated(self) -> bool:
        return bool(self.max_in_flight or self.min_spacing_ms)


_FIELDS = {f.name: f for f in fields(ProviderConfig)}
_POSITIVE = (
    "connect_timeout",
    "total_timeout",
    "max_body_bytes",
    "backoff_max",
    "max_retry_after",
    "gate_retry_seconds",
)
_NON_NEGATIVE = ("max_in_flight", "min_spacing_ms", "max_redirects", "backoff_base")


def build(name: str, *layers: dict[str, Any], extra_allow: tuple[str, ...] = ()) -> ProviderConfig:
    """Merge setting layers over the defaults and validate; a typo is an error, not a default."""
    merged: dict[str, Any] = {}
    for layer in layers:
        unknown = sorted(set(layer) - set(_FIELDS) - {"name"})
        if unknown:
            raise ImproperlyConfigured(
                f"DURABLE_HTTP_PROVIDERS[{name!r}]: unknown key(s) {', '.join(unknown)}; "
                f"valid keys: {', '.join(sorted(set(_FIELDS) - {'name'}))}"
            )
        merged.update(layer)
    merged.pop("name", None)
    listed = merged.pop("allow_hosts", ()) or ()
    if isinstance(listed, str):  # "a,b" from an environment variable
        listed = listed.split(",")
    allow = tuple(h.strip() for h in (*listed, *extra_allow) if h.strip())
    config = ProviderConfig(name=name, allow_hosts=allow, **merged)
    for key in _POSITIVE:
        if not float(getattr(config, key)) > 0:
            raise ImproperlyConfigured(f"DURABLE_HTTP_PROVIDERS[{name!r}][{key!r}] must be > 0")
    for key in _NON_NEGATIVE:
        if float(getattr(config, key)) < 0:
            raise ImproperlyConfigured(f"DURABLE_HTTP_PROVIDERS[{name!r}][{key!r}] must be >= 0")
    return config


def provider_config(name: str) -> ProviderConfig:
    """The configuration of provider ``name`` from the current settings."""
    providers = getattr(settings, "DURABLE_HTTP_PROVIDERS", None) or {}
    extra = tuple(getattr(settings, "DURABLE_HTTP_ALLOW_HOSTS", ()) or ())
    layers = [providers.get("default", {})]
    if name != "default":
        layers.append(providers.get(name, {}))
    return build(name, *layers, extra_allow=extra)
