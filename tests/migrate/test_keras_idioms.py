"""tfring.migrate.keras_idioms: each Keras 2 idiom Keras 3 rejects, fixed or
reported, and what must be left alone. The last test checks on Keras 3
itself that every old form fails and every rewritten one runs."""
import os
import subprocess
import sys
import textwrap

import pytest

from support import ROOT
from tfring.migrate import migrate_source
from tfring.migrate.keras_idioms import OPTIMIZERS

HEAD = "import tensorflow as tf\n"


def migrate(body, head=HEAD):
    return migrate_source(head + textwrap.dedent(body))


def body_of(result, head=HEAD):
    return result.text[len(head):]


@pytest.mark.parametrize("before, after", [
    # experimental_run_tf_function, wherever it is among the arguments
    ("model.compile(optimizer=opt, loss='mse', experimental_run_tf_function=False)\n",
     "model.compile(optimizer=opt, loss='mse')\n"),
    ("model.compile(experimental_run_tf_function=False, optimizer=opt)\n",
     "model.compile(optimizer=opt)\n"),
    ("model.compile(experimental_run_tf_function=False)\n", "model.compile()\n"),
    ("model.compile(experimental_run_tf_function=False,)\n", "model.compile()\n"),
    ("model.compile(loss='mse',\n              experimental_run_tf_function=False,\n"
     "              metrics=['acc'])\n",
     "model.compile(loss='mse',\n              metrics=['acc'])\n"),
    ("model.compile(loss='mse',  # keep me\n              experimental_run_tf_function=False)\n",
     "model.compile(loss='mse'  # keep me\n              )\n"),
    # lr= in optimizer constructors, under every spelling of the module
    ("opt = tf.keras.optimizers.Adam(lr=0.1)\n",
     "opt = tf.keras.optimizers.Adam(learning_rate=0.1)\n"),
    ("opt = tf.optimizers.SGD(lr=0.1, momentum=0.9)\n",
     "opt = tf.optimizers.SGD(learning_rate=0.1, momentum=0.9)\n"),
    # legacy / experimental optimizers
    ("opt = tf.keras.optimizers.legacy.SGD(0.1)\n", "opt = tf.keras.optimizers.SGD(0.1)\n"),
    ("opt = tf.keras.optimizers.experimental.AdamW(0.1)\n",
     "opt = tf.keras.optimizers.AdamW(0.1)\n"),
    # opt.lr and opt.variables() on what is known to be a Keras optimizer
    ("opt = tf.keras.optimizers.SGD(0.1)\nopt = hvd.DistributedOptimizer(opt)\n"
     "print(opt.lr)\nopt.lr = 0.2\nv = opt.variables()\n",
     "opt = tf.keras.optimizers.SGD(0.1)\nopt = hvd.DistributedOptimizer(opt)\n"
     "print(opt.learning_rate)\nopt.learning_rate = 0.2\nv = opt.variables\n"),
    ("x = self.model.optimizer.lr\ny = model.optimizer.variables()\n",
     "x = self.model.optimizer.learning_rate\ny = model.optimizer.variables\n"),
    # K.set_value on a Keras variable
    ("tf.keras.backend.set_value(model.optimizer.lr, 0.5)\n",
     "model.optimizer.learning_rate.assign(0.5)\n"),
    ("tf.keras.backend.set_value(a if b else c, 0.5)\n", "(a if b else c).assign(0.5)\n"),
    # the generator methods and their loader arguments
    ("model.fit_generator(gen, steps_per_epoch=5, workers=4, use_multiprocessing=True)\n",
     "model.fit(gen, steps_per_epoch=5)\n"),
    ("model.fit(x, workers=4,  # many\n          use_multiprocessing=True)\n",
     "model.fit(x   # many\n          )\n"),
    ("model.predict(workers=4, use_multiprocessing=True,)\n", "model.predict()\n"),
    ("model.evaluate_generator(gen, max_queue_size=3)\n", "model.evaluate(gen)\n"),
    ("tf.keras.layers.BatchNormalization(fused=False, momentum=0.9)\n",
     "tf.keras.layers.BatchNormalization(momentum=0.9)\n"),
])
def test_mechanical_fixes(before, after):
    result = migrate(before)
    assert body_of(result) == after
    assert result.findings and not result.manual, result.findings


@pytest.mark.parametrize("before, after", [
    ("from tensorflow.keras.optimizers.legacy import Adam\no = Adam(lr=1.0)\n",
     "from tensorflow.keras.optimizers import Adam\no = Adam(learning_rate=1.0)\n"),
    ("import keras\no = keras.optimizers.legacy.RMSprop(lr=1.0)\n",
     "import keras\no = keras.optimizers.RMSprop(learning_rate=1.0)\n"),
    ("from tensorflow.keras import backend as K\nK.set_value(opt.lr, 2)\n"
     "opt = tf.keras.optimizers.SGD()\n",
     "from tensorflow.keras import backend as K\nopt.learning_rate.assign(2)\n"
     "opt = tf.keras.optimizers.SGD()\n"),
    ("import tensorflow.compat.v1 as tf1\no = tf1.keras.optimizers.Adam(lr=1.0)\n",
     "import tensorflow.compat.v1 as tf1\no = tf1.keras.optimizers.Adam(learning_rate=1.0)\n"),
])
def test_fixes_follow_the_imports(before, after):
    assert migrate(before).text == HEAD + after


def test_legacy_import_is_rewritten():
    head = ""
    result = migrate("from tensorflow.keras.optimizers.legacy import Adam, SGD\n", head=head)
    assert result.text == "from tensorflow.keras.optimizers import Adam, SGD\n"


@pytest.mark.parametrize("text", [
    "args.lr = 0.1\nprint(args.lr * 2)\n",                      # the user's own lr
    "def train(lr=0.1):\n    return lr\ntrain(lr=0.5)\n",       # a function's lr= argument
    "config = dict(lr=0.1)\n",
    "sched = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1)\n",
    "opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)\nv = opt.variables()\n",
    "opt = hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))\n"
    "v = opt.variables()\n",
    "m = tf.keras.Sequential()\nm.compile(loss='mse')\n",
    "s = 'opt.lr experimental_run_tf_function=False'  # opt.variables()\n",
    "tf.keras.optimizers.SGD(learning_rate=0.1)\n",
])
def test_left_alone(text):
    result = migrate(text)
    assert body_of(result) == text and not result.findings, result.findings


@pytest.mark.parametrize("text, line, words", [
    ("thing.variables()\n", 2, "cannot tell"),                 # what is "thing"? ambiguous
    ("def f(opt):\n    return opt.lr\n", 3, "no .lr"),         # a parameter: type unknown
    ("tf.keras.backend.get_session()\n", 2, "no session"),
    ("tf.compat.v1.keras.backend.set_session(s)\n", 2, "no session"),
    ("grads = model.optimizer.get_gradients(loss, params)\n", 2, "no get_gradients"),
    ("class Opt(tf.keras.optimizers.Adam):\n    def _aggregate_gradients(self, g):\n"
     "        return g\n", 3, "never calls"),
    ("class Opt(tf.keras.optimizers.Optimizer):\n    def get_gradients(self, l, p):\n"
     "        pass\n", 3, "never calls"),
    ("m = hvd.load_model('saved_model_dir')\n", 2, ".keras"),
    ("m = hvd.load_model(f'{d}/checkpoint-{epoch}.h5')\n", 2, ".h5 file"),
    ("m = tf.keras.models.load_model('model.h5', custom_objects={})\n", 2, ".h5 file"),
    ("m = hvd.load_model('./checkpoint-{epoch}.h5'.format(epoch=3))\n", 2, ".h5 file"),
    ("model.save(os.path.join(log_dir, 'saved'))\n", 2, ".keras"),
    ("model.save('/tmp/checkpoint')\n", 2, ".keras"),
    ("model.save_weights(f'{d}/weights.h5')\n", 2, ".weights.h5"),
    ("cb = tf.keras.callbacks.ModelCheckpoint('ckpt-{epoch}.h5', save_weights_only=True)\n", 2,
     ".weights.h5"),
    ("o = tf.keras.optimizers.SGD(0.1, decay=1e-4)\n", 2, "ignore decay"),
    ("o = tf.keras.optimizers.Adam(lr=0.1, learning_rate=0.2)\n", 2, "both"),
    ("model.compile(loss='mse', target_tensors=[t])\n", 2, "not a Keras 3 argument"),
    ("x = tf.keras.backend.learning_phase()\n", 2, "learning phase"),
    ("o = tf.keras.optimizers.legacy.Optimizer(name='x')\n", 2, "no keras.optimizers.legacy"),
])
def test_reported_with_line_and_fix(text, line, words):
    result = migrate(text)
    assert result.manual, result.findings
    finding = result.manual[0]
    assert finding.line == line and words in finding.message and finding.fix
    assert f"t.py:{line}: manual: " in finding.format("t.py")


def test_checkpoint_paths_keras3_accepts_are_not_reported():
    result = migrate("model.save('m.keras')\nmodel.save('m.h5')\n"
                     "model.save_weights('w.weights.h5')\n"
                     "tf.keras.callbacks.ModelCheckpoint('ckpt-{epoch}.h5')\n"
                     "ckpt.save('prefix')\nhvd.load_model(path)\n"
                     "model.save(os.path.join(d, 'm.keras'))\nmodel.save(','.join(parts))\n")
    assert not result.findings, result.findings


def test_a_second_run_changes_nothing():
    text = HEAD + textwrap.dedent("""\
        from tensorflow.keras import backend as K
        import horovod.tensorflow.keras as hvd
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(lr=0.1))
        model.compile(opt, 'mse', experimental_run_tf_function=False)
        K.set_value(model.optimizer.lr, K.get_value(opt.lr) * 2)
        model.fit_generator(g, workers=2)
        hvd.broadcast_variables(opt.variables(), 0)
        """)
    once = migrate_source(text)
    assert once.changed
    twice = migrate_source(once.text)
    assert not twice.changed and not twice.findings, twice.findings


def test_optimizer_list_matches_keras3():
    tf = pytest.importorskip("tensorflow")
    missing = [name for name in OPTIMIZERS if not hasattr(tf.keras.optimizers, name)]
    assert not missing


# Each pair: a Keras 2 form, which Keras 3 must reject, and the tool's rewrite,
# which must run. Run in one Python process: snippets share the set-up below.
PITFALLS = """\
import tensorflow as tf
from tensorflow.keras import backend as K
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
opt = tf.keras.optimizers.SGD(0.1)
"""
SNIPPETS = [
    "model.compile(optimizer='sgd', loss='mse', experimental_run_tf_function=False)",
    "tf.keras.optimizers.Adam(lr=0.1)",
    "print(opt.lr)",
    "print(opt.variables())",
    "tf.keras.optimizers.legacy.SGD(0.1)",
    "K.set_value(opt.lr, 0.5)",
    "model.fit_generator(tf.data.Dataset.from_tensors((tf.zeros((4, 3)), tf.zeros((4, 2)))),"
    " verbose=0)",
    "model.fit(tf.zeros((4, 3)), tf.zeros((4, 2)), workers=2, verbose=0)",
    "tf.keras.layers.BatchNormalization(fused=False)",
]


def test_every_fixed_pitfall_fails_on_keras3_and_its_fix_runs():
    fixed = [body_of(migrate(s + "\n", head=PITFALLS), PITFALLS).strip() for s in SNIPPETS]
    assert all(a != b for a, b in zip(SNIPPETS, fixed)), fixed
    code = PITFALLS + textwrap.dedent(f"""\
        model.compile(optimizer=opt, loss='mse')
        for snippet in {SNIPPETS + fixed!r}:
            try:
                exec(snippet)
                print('RAN', snippet)
            except Exception as e:
                print('FAILED', snippet, type(e).__name__)
        """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in result.stdout.splitlines() if line.startswith(("RAN", "FAILED"))]
    assert len(lines) == 2 * len(SNIPPETS), result.stdout + result.stderr[-3000:]
    for snippet, line in zip(SNIPPETS, lines):
        assert line.startswith("FAILED"), f"Keras 3 accepts {snippet!r}: {line}"
    for snippet, line in zip(fixed, lines[len(SNIPPETS):]):
        assert line.startswith("RAN"), f"the fix {snippet!r} fails: {line}"
