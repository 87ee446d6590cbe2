"""KV block reports read vLLM's internals: when those change, the log says so and nothing else breaks."""

import logging
from types import SimpleNamespace

from agent_gravity.backends import _vllm_blocks
from agent_gravity.backends._vllm_blocks import BlockLedger, ledger_for


def _engine(pool) -> SimpleNamespace:
    manager = SimpleNamespace(free=lambda r: None, pop_blocks_for_free=lambda r: None, block_pool=pool,
                              get_block_ids=lambda rid: [[1, 2, 3]])
    scheduler = SimpleNamespace(kv_cache_manager=manager, block_size=16)
    return SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler)))


def test_an_engine_without_the_internals_gets_no_ledger_and_a_warning(caplog):
    _vllm_blocks._unreadable.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert ledger_for(SimpleNamespace(engine_core=SimpleNamespace())) is None
    assert "KV block reports are off" in caplog.text and "engine_core" in caplog.text


def test_a_report_whose_internals_vanished_is_none_and_said_once(caplog):
    _vllm_blocks._unreadable.cache_clear()
    ledger = BlockLedger(_engine(SimpleNamespace()))  # a block pool without its counters
    ledger.watch("req")
    ledger._manager.free(SimpleNamespace(request_id="req-abcdefgh"))
    with caplog.at_level(logging.WARNING):
        assert ledger.report("req", 0) is None and ledger.report("req", 0) is None
    assert caplog.text.count("KV block reports are off") == 1


def test_a_report_reads_the_blocks_a_request_held():
    pool = SimpleNamespace(num_gpu_blocks=11, get_num_free_blocks=lambda: 4)
    ledger = BlockLedger(_engine(pool))
    ledger.watch("req")
    ledger._manager.free(SimpleNamespace(request_id="req-abcdefgh"))
    report = ledger.report("req", 5)
    assert (report.blocks, report.block_size, report.cached_tokens, report.engine_blocks_used,
            report.engine_blocks_total) == (
        3, 16, 5, 6, 10)
