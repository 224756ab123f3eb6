"""Plain kernels that move a pass's necessary bytes (bench.necessary_bytes) and compute none of the softmax: what
the memory sustains for a cell's own bytes, in its own pattern, timed as ours is. `benchmarks/sweep.py --plain`
times them in place of ours.

  forward:  y = x; y = x + mask (a floating mask); y = x where the mask is true, else 0 (a bool mask)
  backward: dx = y * dy
Causal rows read the keys they see, in whole 16-byte vectors as ours does, and write all of the row, zeros past
the vectors they read. A mask row that several rows of x share is read again for each, from L2 after the first;
the batch's repeats of a bias row are taken one after another, as ours takes them, so that a bias larger than L2 is
read once.
"""
import torch
import triton
import triton.language as tl

# Elements a program moves of each operand.
TILE = 4096
# What plain_kernel does with its operands (constexpr, so that the kernel may read them).
COPY, ADD, SELECT, MULTIPLY = (tl.constexpr(op) for op in range(4))


@triton.jit
def plain_kernel(first, second, out, cols, queries, second_div, second_rows, repeats, rows_per_repeat,
                 ROWS: tl.constexpr, COLS: tl.constexpr, VEC: tl.constexpr, OP: tl.constexpr,
                 CAUSAL: tl.constexpr):
    """out = first (OP COPY), or first combined with `second` (its row (r // second_div) % second_rows for row r
    of first), over a tile of ROWS x COLS. Consecutive programs go along a row's tiles, then take a block of rows'
    `repeats`, rows `rows_per_repeat` apart, before the next block."""
    column_tiles = cols // COLS
    row_tile = tl.program_id(0) // column_tiles
    block = row_tile // repeats
    repeat = row_tile % repeats
    rows = (repeat.to(tl.int64) * rows_per_repeat + block.to(tl.int64) * ROWS + tl.arange(0, ROWS))[:, None]
    columns = tl.program_id(0) % column_tiles * COLS + tl.arange(0, COLS)[None, :]
    offsets = rows * cols + columns
    # Upper-left: query i sees keys j <= i; a vector is read whole where its first key is seen.
    seen = (columns // VEC) * VEC <= rows % queries
    if CAUSAL:
        values = tl.load(first + offsets, mask=seen, other=0.0)
    else:
        values = tl.load(first + offsets)
    if OP != COPY:
        second_offsets = (rows // second_div % second_rows) * cols + columns
        if CAUSAL:
            other = tl.load(second + second_offsets, mask=seen, other=0.0)
        else:
            other = tl.load(second + second_offsets)
        if OP == ADD:
            values = values.to(tl.float32) + other.to(tl.float32)
        elif OP == SELECT:
            values = tl.where(other != 0, values, 0.0)
        else:
            values = values.to(tl.float32) * other.to(tl.float32)
    tl.store(out + offsets, values.to(out.dtype.element_ty))


def launch(first, second, out, op, is_causal, second_div=1, second_rows=None):
    """plain_kernel over first's rows (`second`: None for COPY, or rows as plain_kernel reads them)."""
    *_, queries, cols = first.shape
    rows = first.numel() // cols
    second_rows = rows if second_rows is None else second_rows
    # A row that x's rows repeat over the batch: its repeats one after another.
    repeats = rows // second_rows if second_div == 1 else 1
    rows_per_repeat = rows // repeats
    col_tile = min(TILE, cols)
    row_tile = TILE // col_tile
    if cols % col_tile or rows_per_repeat % row_tile:
        raise ValueError(f"{rows_per_repeat} rows of {cols} columns do not split into tiles of {row_tile} rows")
    plain_kernel[(rows // row_tile * (cols // col_tile),)](
        first, first if second is None else second, out, cols, queries, second_div, second_rows, repeats,
        rows_per_repeat, ROWS=row_tile, COLS=col_tile, VEC=16 // first.element_size(), OP=op.value, CAUSAL=is_causal)
    return out


def mask_rows(mask, x):
    """(second_div, second_rows) with which x's row r finds its row of `mask`, a contiguous mask of x's rank that
    is full, or broadcast over the batch ([1, H, Sq, Sk], a bias) or over heads and queries ([B, 1, 1, Sk])."""
    batch, heads, queries, _ = x.shape
    shape = tuple(mask.shape[:-1])
    if shape == (batch, heads, queries):
        return 1, batch * heads * queries
    if shape == (1, heads, queries):
        return 1, heads * queries
    if shape == (batch, 1, 1):
        return heads * queries, batch
    raise ValueError(f"plain kernels take masks of [B, H, Sq], [1, H, Sq] or [B, 1, 1] rows, got {list(shape)}")


def movers(x, mask, is_causal, y, dy):
    """{"fwd": fn, "bwd": fn}: the plain kernels of a cell's passes, on its inputs (x and the mask forward, y and
    dy backward)."""
    if is_causal and mask is not None:
        raise ValueError("plain kernels take a mask or the causal limit, not both")
    out = torch.empty_like(x)
    if mask is None:
        forward = lambda: launch(x, None, out, COPY, is_causal)  # noqa: E731
    else:
        mask = mask.contiguous()
        op = SELECT if mask.dtype == torch.bool else ADD
        forward = lambda: launch(x, mask, out, op, False, *mask_rows(mask, x))  # noqa: E731
    return {"fwd": forward, "bwd": lambda: launch(y, dy, out, MULTIPLY, is_causal)}
