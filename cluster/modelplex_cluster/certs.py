"""Certificates and keys for the local control plane, made with ``cryptography``.

One CA signs everything: the apiserver's serving certificate, the client
certificates of the admin, the controller-manager and the test kubelet, and
the apiserver's client certificate towards the kubelet. The service-account
key pair signs and verifies ServiceAccount tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _certificate(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *,
                 ca: bool) -> x509.CertificateBuilder:
    """A builder with what every certificate here carries: a year's validity (from five minutes
    ago, for clock skew), its basic constraints and its key usage (a CA signs certificates and
    CRLs; a leaf signs and enciphers keys)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=not ca,
                data_encipherment=False, key_agreement=False, key_cert_sign=ca,
                crl_sign=ca, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    )


class CertificateAuthority:
    """A throwaway CA whose files live in ``directory``."""

    def __init__(self, directory: Path, name: str = "modelplex-local-ca"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        self._cert = (
            _certificate(subject, subject, self._key.public_key(), ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = self.directory / "ca.crt"
        self.key_path = self.directory / "ca.key"
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.key_path, self._key)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        client: bool = False,
        server: bool = False,
    ) -> KeyPair:
        """Issue a certificate; writes ``<stem>.crt`` and ``<stem>.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        usages = []
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            _certificate(_name(common_name, organization), self._cert.subject, key.public_key(), ca=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    """An RSA key pair for signing ServiceAccount tokens: (private key, public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = Path(directory) / "sa.key"
    public = Path(directory) / "sa.pub"
    _write_key(private, key)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public
