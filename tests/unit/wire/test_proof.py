"""A picker's proof admits one model on one replica for a few seconds, and nothing else (times
from a fake clock: plain numbers)."""

from __future__ import annotations

from modelplex.wire.proof import MAX_PROOFS, PROOF_TTL_S, check_proof, endpoint, make_proof

KEY = "deployment-credential-0123456789"
NOW = 1_800_000_000.0


def test_a_proof_admits_its_model_on_its_replica_until_it_expires():
    proof = make_proof(KEY, "m1", "10.0.0.7:8000", NOW)
    assert check_proof((KEY,), proof, "m1", "10.0.0.7:8000", NOW)
    assert check_proof((KEY,), proof, "m1", "10.0.0.7:8000", NOW + PROOF_TTL_S - 1)
    assert not check_proof((KEY,), proof, "m1", "10.0.0.7:8000", NOW + PROOF_TTL_S + 1)


def test_a_proof_is_not_replayable_to_another_model_or_replica():
    proof = make_proof(KEY, "m1", "10.0.0.7:8000", NOW)
    assert not check_proof((KEY,), proof, "m2", "10.0.0.7:8000", NOW)
    assert not check_proof((KEY,), proof, "m1", "10.0.0.8:8000", NOW)
    assert not check_proof((KEY,), proof, "m1", "10.0.0.7:8001", NOW)
    assert not check_proof((KEY,), proof, "", "10.0.0.7:8000", NOW)


def test_a_proof_signed_with_another_credential_or_altered_is_refused():
    assert not check_proof((KEY,), make_proof("another-credential", "m1", "10.0.0.7:8000", NOW), "m1",
                           "10.0.0.7:8000", NOW)
    proof = make_proof(KEY, "m1", "10.0.0.7:8000", NOW)
    version, expiry, mac = proof.split(".")
    longer = f"{version}.{int(expiry) + 5}.{mac}"  # a client stretching its lifetime
    assert not check_proof((KEY,), longer, "m1", "10.0.0.7:8000", NOW)
    for forged in ("", "v1", "v1..", f"v2.{expiry}.{mac}", f"v1.{expiry}.", f"v1.-1.{mac}", "v1.x.y", mac):
        assert not check_proof((KEY,), forged, "m1", "10.0.0.7:8000", NOW)
    assert not check_proof((), proof, "m1", "10.0.0.7:8000", NOW)


def test_a_proof_minted_far_ahead_is_refused_even_with_the_key():
    far = make_proof(KEY, "m1", "10.0.0.7:8000", NOW, ttl_s=3600)
    assert not check_proof((KEY,), far, "m1", "10.0.0.7:8000", NOW)


def test_either_of_two_credentials_during_an_upgrade_verifies():
    proof = make_proof("namespace-token", "m1", "10.0.0.7:8000", NOW)
    assert check_proof((KEY, "namespace-token"), proof, "m1", "10.0.0.7:8000", NOW)


def test_ids_with_separators_cannot_make_two_requests_sign_alike():
    proof = make_proof(KEY, "a\n1:b", "c", NOW)
    assert not check_proof((KEY,), proof, "a", "b\n1:c", NOW)


def test_endpoints_are_ip_port_with_ipv6_bracketed():
    assert endpoint("127.0.0.1", 80) == "127.0.0.1:80"
    assert endpoint("::1", 80) == "[::1]:80"
    assert endpoint("[::1]", 80) == "[::1]:80"


def test_a_list_of_proofs_admits_on_each_replica_it_names_and_no_other():
    listed = ",".join(make_proof(KEY, "m", replica, NOW) for replica in ("10.0.0.1:80", "10.0.0.2:80"))
    assert check_proof((KEY,), listed, "m", "10.0.0.1:80", NOW)
    assert check_proof((KEY,), listed, "m", "10.0.0.2:80", NOW)
    assert not check_proof((KEY,), listed, "m", "10.0.0.3:80", NOW)
    assert not check_proof((KEY,), listed, "other", "10.0.0.2:80", NOW)
    # Only the first MAX_PROOFS are looked at: a long header costs a bounded number of MACs.
    padded = ",".join([make_proof(KEY, "m", "10.0.0.9:80", NOW)] * MAX_PROOFS + [listed])
    assert not check_proof((KEY,), padded, "m", "10.0.0.1:80", NOW)
