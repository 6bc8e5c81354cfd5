"""The one trust rule (kcache/store/trust.py) that the shared tier and bundles both apply."""

from __future__ import annotations

from kcache import kinds
from kcache.store import trust
from kcache.store.tiers import entry as rt


def test_the_rule_for_every_kind() -> None:
    for name, k in kinds.KINDS.items():
        if k.machine_local:
            assert trust.refusal(name, True) == trust.refusal(name, False) == trust.MACHINE_LOCAL
        elif k.host_code or k.pickled or k.signed_only:
            assert trust.refusal(name, False) == trust.UNSIGNED and trust.may_cross(name, True)
        else:
            assert trust.may_cross(name, False) and trust.may_cross(name, True)
    # Dynamo's restart records steer what torch compiles, unchecked: signed only, as torch's entries
    assert trust.refusal("inductor-restart", False) == trust.UNSIGNED
    # a kind this kcache does not know (a newer one's) gets the strictest rule
    assert trust.refusal("kind-from-the-future", True) == trust.MACHINE_LOCAL


def test_the_shared_tier_applies_the_same_rule() -> None:
    for name in kinds.KINDS:
        assert rt.eligible(name, b"secret") == trust.may_cross(name, True)
        assert rt.eligible(name, None) == trust.may_cross(name, False)


def test_a_signature_is_for_one_domain_and_one_secret() -> None:
    body = b"the same bytes"
    sig = trust.sign(b"s1", b"entry\0", body)
    assert trust.verify(b"s1", b"entry\0", body, sig)
    assert trust.verify(b"s1", b"entry\0", body, sig.hex())  # bundles and locks keep hex
    assert not trust.verify(b"s1", b"lock\0", body, sig)  # made for an entry: not a lock's
    assert not trust.verify(b"s2", b"entry\0", body, sig)
    assert not trust.verify(b"s1", b"entry\0", body + b"!", sig)
    for junk in (None, 3, "zz", "", b"", sig[:-1], sig.hex().upper() + "0"):
        assert not trust.verify(b"s1", b"entry\0", body, junk)
