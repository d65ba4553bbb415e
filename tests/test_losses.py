"""Contrastive losses: hand-computed answers, the no-gradient flag, and 2 processes == 1 process."""

import math

import pytest
import torch
import torch.distributed as dist

from c2llm_lib.losses import contrastive_loss

from spawn import run_processes


def test_in_batch_known_answer():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[3.0, 0.0], [0.0, 1.0]])  # cosines: identity matrix
    out = contrastive_loss(q, p, tau=0.5)
    expected = math.log(1 + math.exp(-2))  # softmax over [1/0.5, 0/0.5] for the right one
    assert out["in_batch"].item() == pytest.approx(expected, rel=1e-6)
    assert out["hard_negative"].item() == 0 and out["loss"].item() == pytest.approx(expected, rel=1e-6)


def test_hard_negative_term_known_answer():
    q = torch.tensor([[1.0, 0.0]])
    p = torch.tensor([[1.0, 0.0]])
    n = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]]])  # cosines 0 and -1
    out = contrastive_loss(q, p, n, tau=1.0)
    expected_hard = -math.log(math.e / (math.e + 1 + math.exp(-1)))
    assert out["hard_negative"].item() == pytest.approx(expected_hard, rel=1e-6)
    assert out["in_batch"].item() == pytest.approx(0.0, abs=1e-7)  # one row: its positive is all there is
    joint = contrastive_loss(q, p, n, tau=1.0, joint=True)
    assert joint["in_batch"].item() == pytest.approx(expected_hard, rel=1e-6) and joint["hard_negative"] == 0
    weighted = contrastive_loss(q, p, n, tau=1.0, weight=0.5)
    assert weighted["loss"].item() == pytest.approx(0.5 * expected_hard, rel=1e-6)


def test_masked_negative_slots_take_no_part_known_answer():
    """Row 0 has both negatives, row 1 only its first, row 2 none: each row is scored over what it has, a row with
    none adds 0, and the term is the mean over the 3 rows (so a global batch's mean does not depend on how its rows
    are split over processes)."""
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    p = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    n = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]]] * 3)  # cosines 0 and -1, in every row
    n[1, 1] = n[2, 0] = n[2, 1] = torch.nan  # empty slots hold anything: they are masked, never read
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    out = contrastive_loss(q, p, n, tau=1.0, negative_mask=mask)
    both = -math.log(math.e / (math.e + 1 + math.exp(-1)))
    first = -math.log(math.e / (math.e + 1))
    assert out["hard_negative"].item() == pytest.approx((both + first + 0.0) / 3, rel=1e-6)
    # one row at a time gives the same terms: the mask is per row, not per batch
    rows = [contrastive_loss(q[i : i + 1], p[i : i + 1], n[i : i + 1], tau=1.0, negative_mask=mask[i : i + 1])
            for i in range(3)]  # fmt: skip
    assert [r["hard_negative"].item() for r in rows] == pytest.approx([both, first, 0.0], rel=1e-6, abs=1e-7)
    joint = contrastive_loss(q, p, n, tau=1.0, negative_mask=mask, joint=True)
    assert torch.isfinite(joint["loss"])
    with pytest.raises(ValueError, match="negative_mask"):
        contrastive_loss(q, p, n, negative_mask=mask[:, :1])


def test_no_gradient_flag_stops_passage_gradients():
    q = torch.randn(4, 8, requires_grad=True)
    p = torch.randn(4, 8, requires_grad=True)
    contrastive_loss(q, p, gather_grad=False)["in_batch"].backward()
    assert p.grad is None and q.grad.abs().sum() > 0
    p2 = p.detach().clone().requires_grad_()
    contrastive_loss(q, p2, gather_grad=True)["in_batch"].backward()
    assert p2.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="differ"):
        contrastive_loss(torch.zeros(2, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="tau"):
        contrastive_loss(torch.zeros(2, 3), torch.zeros(2, 3), tau=0)


def _worker(rank, world, init_file, out, q, p, n, gather_grad, gather="functional"):
    from c2llm_lib import distributed

    distributed._GATHER = getattr(distributed, f"{gather}_gather")  # torch's functional gather, or the older one's
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        b = q.shape[0] // world
        sl = slice(rank * b, (rank + 1) * b)
        ql, pl, nl = (t[sl].clone().requires_grad_() for t in (q, p, n))
        loss = contrastive_loss(ql, pl, nl, tau=0.05, gather_grad=gather_grad)["loss"]
        loss.backward()
        # what DDP would do: average the (here input) gradients' owners' losses -> divide by world
        out[rank] = {"loss": loss.detach(), "q": ql.grad / world, "p": pl.grad / world, "n": nl.grad / world}
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_two_processes(q, p, n, gather_grad, gather="functional"):
    return run_processes(_worker, 2, q, p, n, gather_grad, gather)


@pytest.mark.parametrize("gather", ["functional", "legacy"])  # legacy: a torch without all_gather_single_autograd
def test_two_processes_equal_one_process_on_the_concatenated_batch(gather):
    gen = torch.Generator().manual_seed(0)
    q, p = torch.randn(6, 16, generator=gen), torch.randn(6, 16, generator=gen)
    n = torch.randn(6, 3, 16, generator=gen)
    qs, ps, ns = (t.clone().requires_grad_() for t in (q, p, n))
    single = contrastive_loss(qs, ps, ns, tau=0.05)["loss"]
    single.backward()
    two = run_two_processes(q, p, n, gather_grad=True, gather=gather)
    mean_loss = (two[0]["loss"] + two[1]["loss"]) / 2
    torch.testing.assert_close(mean_loss, single.detach(), rtol=1e-5, atol=1e-6)
    for name, ref in (("q", qs.grad), ("p", ps.grad), ("n", ns.grad)):
        torch.testing.assert_close(torch.cat([two[0][name], two[1][name]]), ref, rtol=1e-4, atol=1e-6, msg=name)
    # the F2LLM behaviour gets the passage gradients wrong: only the hard-negative term reaches them
    broken = run_two_processes(q, p, n, gather_grad=False)
    assert not torch.allclose(torch.cat([broken[0]["p"], broken[1]["p"]]), ps.grad, atol=1e-4)
