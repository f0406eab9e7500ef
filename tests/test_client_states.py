"""Client-local states: kept in memory up to a budget, spilled to disk past it, checkpointable."""
import pytest
import torch
from conftest import small_run

from fedvlp.platform.runtime.client_states import ClientStateStore
from fedvlp.platform.runtime.engine import run_federated


def state(value: float) -> dict:
    return {"prompt": torch.full((4, 8), float(value))}  # 128 bytes


def test_states_past_the_budget_spill_to_disk_and_read_back(tmp_path):
    store = ClientStateStore(tmp_path, budget_bytes=256)
    for cid in range(4):
        store.put(cid, state(cid), round_index=1)
    assert sorted(store.in_memory) == [0, 1] and store.on_disk == {2: 1, 3: 1}
    assert all(torch.equal(store.get(cid)["prompt"], state(cid)["prompt"]) for cid in range(4))
    assert store.get(9) is None
    store.put(0, state(10), round_index=2)  # a client in memory stays there
    store.put(3, state(30), round_index=2)  # a spilled one gets a new file; the old one outlives round 2's checkpoint
    assert store.in_memory[0]["prompt"][0, 0] == 10 and store.get(3)["prompt"][0, 0] == 30
    files = {p.name for p in tmp_path.glob("*.safetensors")}
    assert files == {"client2-round1.safetensors", "client3-round1.safetensors", "client3-round2.safetensors"}
    store.put(2, state(20), round_index=3)
    assert not (tmp_path / "client3-round1.safetensors").exists()


def test_a_snapshot_restores_the_states_of_its_round(tmp_path):
    store = ClientStateStore(tmp_path, budget_bytes=0)
    store.put(1, state(1), round_index=1)
    snapshot = store.snapshot()
    store.put(1, state(2), round_index=2)  # round 2 crashed before its checkpoint
    restored = ClientStateStore(tmp_path, budget_bytes=0, snapshot=snapshot)
    assert restored.get(1)["prompt"][0, 0] == 1
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["client1-round1.safetensors"]


def test_a_checkpointed_store_round_trips_every_state_bitwise(tmp_path):
    """The snapshot stacks states per layout: through torch.save and a weights_only load, every client gets its
    exact bits back (mixed layouts, dtypes, 0-d tensors, NaN and -0.0), spilled clients their file, and clients
    that never stored a state still have none."""
    def odd_state(cid: int) -> dict:
        if cid % 3 == 0:  # a second layout: other keys, dtypes and shapes
            return {"scale": torch.tensor(-0.0 if cid == 0 else cid / 7, dtype=torch.float64),
                    "ids": torch.arange(cid, cid + 3), "half": torch.full((2, 2), cid / 3, dtype=torch.bfloat16)}
        prompt = torch.randn(4, 8, generator=torch.Generator().manual_seed(cid))
        prompt[0, 0] = float("nan") if cid == 1 else prompt[0, 0]
        return {"prompt": prompt}

    store = ClientStateStore(tmp_path, budget_bytes=2048)
    stored = {cid: odd_state(cid) for cid in range(40) if cid % 5 != 4}  # clients 4, 9, ... never store a state
    for cid, s in stored.items():
        store.put(cid, {k: t.clone() for k, t in s.items()}, round_index=1 + cid % 2)
    assert store.in_memory and store.on_disk  # some held in memory, the rest spilled past the budget
    torch.save({"clients": store.snapshot()}, tmp_path / "checkpoint.pt")
    restored = ClientStateStore(tmp_path, 2048, torch.load(tmp_path / "checkpoint.pt", weights_only=True)["clients"])

    def bits(t: torch.Tensor) -> bytes:
        return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()

    assert restored.in_memory.keys() == store.in_memory.keys() and restored.on_disk == store.on_disk
    assert restored.memory_bytes == store.memory_bytes
    for cid in range(40):
        got = restored.get(cid)
        if cid not in stored:
            assert got is None
            continue
        assert sorted(got) == sorted(stored[cid])  # (a spilled file lists its keys sorted)
        for key, want in stored[cid].items():
            assert got[key].dtype == want.dtype and got[key].shape == want.shape and bits(got[key]) == bits(want)
    # each restored tensor owns its storage: Ray would otherwise ship the whole stack with one client's state
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size()
               for s in restored.in_memory.values() for t in s.values())


def test_an_empty_store_round_trips(tmp_path):
    snapshot = ClientStateStore(tmp_path, 0).snapshot()
    restored = ClientStateStore(tmp_path, 0, snapshot)
    assert restored.in_memory == {} and restored.on_disk == {} and restored.get(0) is None


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_spilled_client_states_give_the_same_run(ray_cluster, tracking_uri, tmp_path):
    """FedOTP keeps a local prompt per client: all in memory, or all spilled to disk, the run is the same."""
    overrides = ("method.name=fedotp", "method.local_epochs=1", "federation.rounds=2", "federation.participation=0.5")
    in_memory = run_federated(small_run(tracking_uri, tmp_path, *overrides), progress=False)
    spilled = run_federated(small_run(tracking_uri, tmp_path, *overrides, "resources.client_state_memory_mb=0"),
                            progress=False)
    assert spilled.final == in_memory.final
    assert all(torch.equal(spilled.final_state[k], in_memory.final_state[k]) for k in in_memory.final_state)
    files = list((tmp_path / "runs" / spilled.run_id / "client_states").glob("*.safetensors"))
    assert len(files) >= 2 and not (tmp_path / "runs" / in_memory.run_id / "client_states").exists()
