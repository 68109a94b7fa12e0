"""The scan of a traced step for random numbers no checkpoint holds (`programs.core.random_ops`)."""

import keras
import tensorflow as tf

from programs.core.random_ops import stateful_random_ops


def _graph(fn):
  return tf.function(fn, autograph=False).get_concrete_function(tf.TensorSpec([4])).graph


def test_stateful_random_ops_are_found_in_nested_functions_with_the_line_that_made_them():
  def step(x):
    x = tf.cond(x[0] > 0, lambda: x + tf.random.uniform(tf.shape(x)), lambda: x)
    x = tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v + tf.random.normal([4])), (0, x))[1]
    return x + tf.random.truncated_normal([4])  # The one made here.

  found = stateful_random_ops(_graph(step))
  assert sorted(f.split()[0] for f in found) == [
    "RandomStandardNormal",
    "RandomUniform",
    "TruncatedNormal",
  ], found
  assert any("test_random_ops.py" in f and "truncated_normal" in f for f in found), found


def test_stateless_ops_and_a_models_seed_generator_are_not_listed_keras_global_generator_is():
  seeds = keras.random.SeedGenerator(3)
  generator = tf.random.Generator.from_seed(1)
  dropout = keras.layers.Dropout(0.5)

  def saved(x):
    x = x + tf.random.stateless_uniform([4], seed=[1, 2]) + generator.normal([4])
    return x + keras.random.normal([4], seed=seeds) + dropout(x, training=True)

  assert stateful_random_ops(_graph(saved)) == []
  found = stateful_random_ops(_graph(lambda x: x + keras.random.uniform([4])))
  assert len(found) == 1 and "seed=" in found[0], found
