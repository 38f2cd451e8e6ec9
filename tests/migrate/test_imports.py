"""tfring.migrate.imports: Horovod's imports and the name ``horovod``."""
import textwrap

import pytest

from tfring.migrate import migrate_source


def migrate(text):
    return migrate_source(textwrap.dedent(text))


@pytest.mark.parametrize("before, after", [
    ("import horovod.tensorflow as hvd\n", "import tfring.tensorflow as hvd\n"),
    ("import horovod.tensorflow.keras as hvd\n", "import tfring.keras as hvd\n"),
    ("import horovod.keras as hvd\n", "import tfring.keras as hvd\n"),
    ("from horovod.tensorflow.keras import callbacks\n", "from tfring.keras import callbacks\n"),
    ("from horovod.keras.callbacks import MetricAverageCallback\n",
     "from tfring.keras.callbacks import MetricAverageCallback\n"),
    ("from horovod import tensorflow as hvd\n", "from tfring import tensorflow as hvd\n"),
    ("import horovod.tensorflow.keras.elastic\n", "import tfring.tensorflow.keras.elastic\n"),
    ("from horovod.spark import run\n", "from tfring.spark import run\n"),
    ("import os, horovod.tensorflow as hvd, sys\n", "import os, tfring.tensorflow as hvd, sys\n"),
    ("import horovod . tensorflow as hvd\n", "import tfring.tensorflow as hvd\n"),
    ("from horovod.tensorflow.keras import (\n    callbacks,  # note\n    elastic)\n",
     "from tfring.keras import (\n    callbacks,  # note\n    elastic)\n"),
])
def test_import_forms(before, after):
    result = migrate(before)
    assert result.text == after
    assert result.findings and all(f.fixed for f in result.findings)


def test_the_name_horovod_follows_its_import():
    result = migrate("""\
        import horovod
        import horovod.tensorflow.keras

        def train():
            return horovod.tensorflow.keras.size()

        results = horovod.run(train, np=2, use_gloo=True)
        note = "horovod.run stays in strings"  # and horovod in comments
        """)
    assert result.text == textwrap.dedent("""\
        import tfring
        import tfring.tensorflow.keras

        def train():
            return tfring.tensorflow.keras.size()

        results = tfring.run(train, np=2, use_gloo=True)
        note = "horovod.run stays in strings"  # and horovod in comments
        """)


@pytest.mark.parametrize("text", [
    "import horovod.torch as hvd\n",
    "from horovod.torch import DistributedOptimizer\n",
    "from horovod import torch\n",
    "import horovod.mxnet as hvd\n",
])
def test_horovod_torch_and_mxnet_are_reported_not_rewritten(text):
    result = migrate(text)
    assert result.text == text
    [finding] = result.manual
    assert "not handled" in finding.message and finding.line == 1
    assert "keep this file on Horovod" in finding.fix


def test_horovod_bound_to_torch_too_leaves_every_plain_import():
    text = "import horovod.tensorflow\nimport horovod.torch\nhorovod.tensorflow.init()\n"
    result = migrate(text)
    assert result.text == text  # one name cannot mean two packages
    assert [f.line for f in result.manual] == [1, 2]


def test_other_modules_and_lookalikes_are_untouched():
    text = ("import horovodx\nimport my.horovod.tensorflow as hvd\nfrom . import horovod\n"
            "horovod = 3\n")
    result = migrate(text)
    assert result.text == text and not result.findings
