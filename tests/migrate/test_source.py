"""tfring.migrate.source: spans from AST positions, and applying edits."""
from tfring.migrate import migrate_source
from tfring.migrate.source import Edit, Source, apply_edits


def test_columns_after_non_ascii_text_on_the_same_line():
    text = ("import tensorflow as tf\n"
            "print('héllo ✓'); opt = tf.keras.optimizers.Adam(lr=1); print(opt.lr)\n")
    assert migrate_source(text).text == (
        "import tensorflow as tf\n"
        "print('héllo ✓'); opt = tf.keras.optimizers.Adam(learning_rate=1); "
        "print(opt.learning_rate)\n")


def test_segments_span_lines():
    source = Source("x = f(a,\n      b)\r\ny = 2\n")
    call = source.tree.body[0].value
    assert source.segment(call) == "f(a,\n      b)"
    assert source.segment(source.tree.body[1]) == "y = 2"


def test_overlapping_edits_keep_the_outer_one():
    text, applied = apply_edits("abcdef", [Edit(1, 2, "X"), Edit(0, 4, ""), Edit(4, 5, "Y")])
    assert (text, applied) == ("Yf", 2)
