"""A rank's share of a Parquet data set, streamed into ``tf.data`` through
pyarrow in bounded batches (what Horovod's estimator used Petastorm for).

Every rank lists the same files and reads their footers only, so all ranks
agree on the row count N without reading data. Rank r of s takes the
contiguous rows ``[r*N//s, (r+1)*N//s)``, whatever the file and row-group
layout, and reads only the row groups those rows overlap, `read_rows` at a
time. Columns become numpy arrays a block at a time (numbers as they are,
arrays flattened then reshaped); no Python object is made per row. The
shuffle buffer permutes blocks of rows in numpy, and tf.data cuts the
blocks into batches (``rebatch``), so no step of the pipeline works row
by row.

Memory held beyond TensorFlow's own: one pyarrow read block and the
pages it comes from (read in pieces of 256 KB, never a column chunk
whole), the shuffle buffer (up to twice its rows), and tf.data's prefetch
of two batches.
"""
import numpy as np


def plan_share(store, path, rank, size):
    """The row groups rank `rank` of `size` reads from the data set at
    `path`, and the slice of each: a list of (file, row_group, start, stop),
    and the rank's row count. Also returns every rank's row count (the
    same on every rank, from the footers alone)."""
    import pyarrow.parquet as pq
    groups = []  # (file, group, first row overall, rows)
    total = 0
    for name in store.parquet_files(path):
        with store.fs.open(name, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if rows:
                groups.append((name, g, total, rows))
                total += rows
    bounds = [r * total // size for r in range(size + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    share = []
    for name, g, first, rows in groups:
        start, stop = max(lo, first), min(hi, first + rows)
        if start < stop:
            share.append((name, g, start - first, stop - first))
    counts = [bounds[r + 1] - bounds[r] for r in range(size)]
    return share, counts


# pyarrow reads a row group's column chunks whole by default (pre_buffer),
# up to Spark's 128 MB row group per rank; unbuffered, one chunk a column.
# Read in pieces of this size instead, so what a rank holds does not grow
# with the row groups.
_READ_BUFFER_BYTES = 256 << 10


def parquet_file(f):
    """A ``pyarrow.parquet.ParquetFile`` over the open file `f` that reads
    its data in pieces of `_READ_BUFFER_BYTES`, never a column chunk whole."""
    import pyarrow.parquet as pq
    return pq.ParquetFile(f, buffer_size=_READ_BUFFER_BYTES, pre_buffer=False)


def column_to_numpy(array, name):
    """A pyarrow column (numbers, or fixed-length lists of numbers) as a
    float32 numpy array of shape (rows,) or (rows, width).

    Raises:
        ValueError: a null, or lists of different lengths, naming the column.
    """
    import pyarrow as pa
    if array.null_count:
        raise ValueError(f"column {name!r} holds a null")
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
            pa.types.is_fixed_size_list(kind):
        rows = len(array)
        values = array.flatten()
        if values.null_count:
            raise ValueError(f"column {name!r} holds an array with a null")
        flat = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        if rows and flat.size % rows:
            raise ValueError(f"column {name!r} holds arrays of different lengths")
        return flat.reshape(rows, -1 if rows else 0)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return array.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    raise ValueError(f"column {name!r} is of type {kind}: the estimator reads numbers and "
                     f"arrays of numbers (vectors are turned into arrays before they are written)")


def batches(store, share, columns, read_rows):
    """Yields, for each read batch of the share, a list of numpy arrays
    (one per column of `columns`)."""
    for name, group, start, stop in share:
        with store.fs.open(name, "rb") as f:
            reader = parquet_file(f)
            seen = 0
            for batch in reader.iter_batches(batch_size=read_rows, row_groups=[group],
                                             columns=list(columns), use_threads=False):
                lo, hi = max(start - seen, 0), min(stop - seen, batch.num_rows)
                seen += batch.num_rows
                if lo >= hi:
                    if seen >= stop:
                        break
                    continue
                batch = batch.slice(lo, hi - lo)
                yield [column_to_numpy(batch.column(i), c) for i, c in enumerate(columns)]
                if seen >= stop:
                    break


def _shuffled(blocks, buffer_rows, rng):
    """Blocks of rows (lists of arrays, one per column) shuffled through a
    buffer of `buffer_rows` rows: once the buffer holds twice that, it is
    permuted and all but `buffer_rows` random rows go out. Memory: at most
    twice the buffer plus one read block. 0: the blocks as they come."""
    if not buffer_rows:
        yield from blocks
        return
    pending, held = [], 0
    for block in blocks:
        pending.append(block)
        held += len(block[0])
        if held >= 2 * buffer_rows:
            joined = [np.concatenate(parts) for parts in zip(*pending)]
            order = rng.permutation(held)
            out, keep = order[:held - buffer_rows], order[held - buffer_rows:]
            yield [a[out] for a in joined]
            pending, held = [[a[keep] for a in joined]], buffer_rows
    if held:
        joined = [np.concatenate(parts) for parts in zip(*pending)]
        order = rng.permutation(held)
        yield [a[order] for a in joined]


def dataset(store, path, rank, size, layout, batch_size, shuffle_buffer_size=0, seed=None,
            read_rows=4096):
    """The rank's share of the Parquet at `path` as a repeated, batched
    ``tf.data.Dataset`` of Keras's ``(x, y)`` or ``(x, y, sample_weight)``.

    Args:
        store: a :class:`tfring.spark.common.store.Store`.
        layout: how columns become the model's arguments, a dict with
            ``inputs`` (a list of lists of columns: each model input is
            its columns concatenated), ``labels`` (one column per model
            output) and ``weight`` (a column or None), and ``widths``
            (column -> values per row; 0 for a scalar).
        batch_size: rows per batch.
        shuffle_buffer_size: rows in tf.data's shuffle buffer; 0: no shuffle.
        read_rows: rows pyarrow reads at a time.

    Returns:
        (dataset, counts): the dataset and every rank's row count.
    """
    import tensorflow as tf
    share, counts = plan_share(store, path, rank, size)
    inputs, labels, weight, widths = (layout["inputs"], layout["labels"], layout["weight"],
                                      layout["widths"])
    columns = sorted({c for group in inputs for c in group} | set(labels) |
                     ({weight} if weight else set()))
    where = {c: i for i, c in enumerate(columns)}

    def shape(c):
        return (None,) if not widths[c] else (None, widths[c])

    def joined(arrays, group):
        parts = [arrays[where[c]].reshape(len(arrays[where[c]]), -1) for c in group]
        return parts[0] if len(parts) == 1 and widths[group[0]] else np.concatenate(parts, 1)

    def generate():
        rng = np.random.default_rng(seed)
        for arrays in _shuffled(batches(store, share, columns, read_rows),
                                shuffle_buffer_size, rng):
            x = tuple(joined(arrays, g) for g in inputs)
            y = tuple(arrays[where[c]] for c in labels)
            yield (x, y) + ((arrays[where[weight]],) if weight else ())

    x_sig = tuple(tf.TensorSpec((None, sum(max(widths[c], 1) for c in g)), tf.float32)
                  for g in inputs)
    y_sig = tuple(tf.TensorSpec(shape(c), tf.float32) for c in labels)
    signature = (x_sig, y_sig) + ((tf.TensorSpec((None,), tf.float32),) if weight else ())
    # Blocks of rows in, batches out: tf.data slices and joins the blocks
    # (rebatch), with no per-row element anywhere.
    data = tf.data.Dataset.from_generator(generate, output_signature=signature)
    data = data.repeat().rebatch(batch_size, drop_remainder=True)

    def keras_form(*parts):
        x, y = parts[0], parts[1]
        out = (x[0] if len(x) == 1 else x, y[0] if len(y) == 1 else y)
        return out + ((parts[2],) if len(parts) > 2 else ())
    return data.map(keras_form).prefetch(2), counts
