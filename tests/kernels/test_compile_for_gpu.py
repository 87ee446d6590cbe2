"""The Triton kernels compile for a Hopper GPU (sm_90) down to a cubin, with no GPU present: what
the interpreter-mode tests cannot show (the interpreter runs any Python)."""

import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)
I32, F32 = "i32", "fp32"
TOKEN_PARTIAL = {"logits_ptr": "*bf16", "stride_row": I32, "rows_ptr": "*i64", "n_cols": I32, "split_size": I32,
                 "part_ptr": "*fp32", "HAS_ROWS": "constexpr", "BLOCK_SIZE": "constexpr"}
TOKEN_COMBINE = {"part_ptr": "*fp32", "n_splits": I32, "entropy_ptr": "*fp32",
                 "varentropy_ptr": "*fp32", "top_prob_ptr": "*fp32", "margin_ptr": "*fp32", "top_id_ptr": "*i64",
                 "SPLITS": "constexpr"}
ATTENTION = {"q_ptr": "*fp16", "k_ptr": "*fp16", "pos_ptr": "*i32", "seg_ptr": "*i32", "out_ptr": "*fp32",
             "n_queries": I32, "dim": I32, "group": I32, "scale": F32, "sq_h": I32, "sq_q": I32, "sk_h": I32,
             "sk_k": I32, "so_h": I32, "so_q": I32, "n_segments": I32, "CAUSAL": "constexpr",
             "BLOCK_QS": "constexpr", "BLOCK_KS": "constexpr", "BLOCK_D": "constexpr"}

BLOCK_SPARSE = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "table_ptr": "*i32", "count_ptr": "*i32",
                "out_ptr": "*bf16", "lse_ptr": "*fp32", "n": I32, "keys": I32, "dim": I32, "group": I32,
                "scale": F32, **{s: I32 for s in ("sq_h", "sq_n", "sk_h", "sk_n", "sv_h", "sv_n", "so_h", "so_n",
                                                  "st_h", "st_b", "sc_h", "sl_h")},
                "BLOCK": "constexpr", "BLOCK_D": "constexpr"}


def compile_all() -> list[str]:
    """Compile every kernel variant; returns one line per cubin."""
    from agent_gravity.kernels import attention_entropy_triton as attention
    from agent_gravity.kernels import block_sparse_attention_triton as block_sparse
    from agent_gravity.kernels import token_entropy_triton as token

    built = []
    for has_rows in (True, False):
        kernel = compiled(token._partial_kernel, TOKEN_PARTIAL, {"HAS_ROWS": has_rows, "BLOCK_SIZE": token.BLOCK})
        built.append(f"token partial has_rows={has_rows}: {len(kernel.asm['cubin'])} bytes")
    kernel = compiled(token._combine_kernel, TOKEN_COMBINE, {"SPLITS": 8})
    built.append(f"token combine: {len(kernel.asm['cubin'])} bytes")
    for causal in (True, False):
        kernel = compiled(attention._attention_entropy_kernel, ATTENTION,
                          {"CAUSAL": causal, "BLOCK_QS": attention.BLOCK_Q, "BLOCK_KS": attention.BLOCK_K,
                           "BLOCK_D": 64})
        built.append(f"attention causal={causal}: {len(kernel.asm['cubin'])} bytes")
    kernel = compiled(block_sparse._block_sparse_kernel, BLOCK_SPARSE, {"BLOCK": 64, "BLOCK_D": 128})
    built.append(f"block sparse attention: {len(kernel.asm['cubin'])} bytes")
    return built


def compiled(kernel, signature, constexprs):
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER)


def test_every_kernel_compiles_to_a_hopper_cubin():
    # The interpreter (on for the other kernel tests) replaces the compiler: compile in a clean process.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.endswith(" bytes") and " 0 bytes" not in line for line in lines)


if __name__ == "__main__":
    print("\n".join(compile_all()))
