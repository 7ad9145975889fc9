"""The local control plane's certificates: a CA that signs, leaves that it signed."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from modelplex_cluster.certs import CertificateAuthority


def test_the_ca_signs_certificates_and_a_server_leaf_verifies_against_it_with_its_names(tmp_path: Path):
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("apiserver", "kube-apiserver", server_names=("localhost",), server_ips=("127.0.0.1",),
                    server=True)
    root = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())
    leaf = x509.load_pem_x509_certificate(pair.cert.read_bytes())

    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert root.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_encipherment and not usage.key_cert_sign
    leaf.verify_directly_issued_by(root)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert leaf.not_valid_before_utc < leaf.not_valid_after_utc
    assert pair.key.stat().st_mode & 0o777 == 0o600


def test_a_client_leaf_names_its_organization_and_client_usage(tmp_path: Path):
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("admin", "admin", organization="system:masters", client=True)
    leaf = x509.load_pem_x509_certificate(pair.cert.read_bytes())

    assert leaf.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "admin"
    extended = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(extended) == [x509.ExtendedKeyUsageOID.CLIENT_AUTH]
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.pem))
