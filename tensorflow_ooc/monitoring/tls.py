"""Dask TLS for tfooc's clients: ``--scheduler tls://HOST:8786`` with certificates.

``tfooc --tls-ca-file CA --tls-cert CERT --tls-key KEY ...`` sets Dask's own client TLS settings
(``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert``,
``distributed.comm.tls.client.key``) for the command, so every client it makes (``submit``,
``run``, ``cpd``, ``cancel``) builds its :class:`distributed.security.Security` from them. The same
settings can come from Dask's configuration instead (a YAML file or
``DASK_DISTRIBUTED__COMM__TLS__CA_FILE``, ``..._CLIENT__CERT``, ``..._CLIENT__KEY``). Dask's TLS is
mutual: the scheduler refuses a client without a certificate signed by its CA.
"""

from __future__ import annotations

import os
from typing import Any

CONFIG_KEYS = {
    "ca_file": "distributed.comm.tls.ca-file",
    "cert": "distributed.comm.tls.client.cert",
    "key": "distributed.comm.tls.client.key",
}
OPTIONS = {"ca_file": "--tls-ca-file", "cert": "--tls-cert", "key": "--tls-key"}


def tls_config(ca_file: str | None = None, cert: str | None = None, key: str | None = None) -> dict[str, str]:
    """Dask configuration for a TLS client from the CLI's options ({} when none is given).

    Raises
    ------
    ValueError
        When only some of the three are given, or a file does not exist.
    """
    given = {"ca_file": ca_file, "cert": cert, "key": key}
    if not any(given.values()):
        return {}
    # the key may be inside the certificate file, as Dask allows
    missing = [OPTIONS[k] for k in ("ca_file", "cert") if not given[k]]
    if missing:
        raise ValueError(
            f"TLS needs {OPTIONS['ca_file']} and {OPTIONS['cert']} (and {OPTIONS['key']} unless the "
            f"certificate file holds the key); missing {', '.join(missing)}"
        )
    for k, v in given.items():
        if v and not os.path.isfile(str(v)):
            raise ValueError(f"{OPTIONS[k]} {v}: no such file")
    return {CONFIG_KEYS[k]: os.path.abspath(str(v)) for k, v in given.items() if v}


def client_security() -> Any:
    """The :class:`~distributed.security.Security` Dask's configuration gives a client now."""
    from distributed.security import Security

    return Security()


def check_scheduler_address(address: str | None) -> None:
    """Fail early, with what to do, when ``address`` is ``tls://`` and no client certificate is set
    (Dask's own error is a ``TypeError`` about an SSL context)."""
    if not address or not str(address).startswith("tls://"):
        return
    sec = client_security()
    if not (sec.tls_ca_file and sec.tls_client_cert):
        raise ValueError(
            f"--scheduler {address}: the scheduler speaks TLS and needs this client's certificate: pass "
            "--tls-ca-file CA.pem --tls-cert CERT.pem --tls-key KEY.pem (before or after the command), "
            "or set distributed.comm.tls.ca-file / client.cert / client.key in Dask's configuration"
        )
