"""Decoding on device: continuations of right-padded prompts in one `tf.while_loop`, greedy or sampled.

With `cache=True` the keys and values of past positions are kept in a fixed-size buffer, so each new token costs
one position; with `cache=False` every step recomputes the whole prefix (for the benchmark and the equality test).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from executor.tasks.lm.data import BOS_ID, PAD_ID
from executor.tasks.lm.model import DecoderOnlyTransformer


def generate(
  model: DecoderOnlyTransformer,
  prompts: tf.Tensor,
  lengths: tf.Tensor,
  num_new_tokens: int,
  choose: Callable[[tf.Tensor], tf.Tensor],
  cache: bool = True,
  timestamps: bool = False,
) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
  """Continues right-padded prompts by `num_new_tokens` tokens each, on device, in one `tf.while_loop`.

  Every row advances in lockstep from the end of the shortest prompt: while a
  row is still inside its prompt the next token is the prompt's, afterwards
  it is `choose(logits)`; after a row generates `BOS_ID` (end of file) it
  emits `PAD_ID`. With `cache`, the prompts run in one pass that fills a
  key/value buffer of `prompt length + num_new_tokens` positions and each
  step then costs one position; without, each step runs the whole prefix.

  Args:
    model: The model.
    prompts: int32 [b, p], each row `BOS_ID` and the prompt's bytes, then `PAD_ID`.
    lengths: int32 [b], the real length of each prompt (>= 1).
    num_new_tokens: Tokens generated per row (static).
    choose: logits float32 [b, vocab] -> int32 [b]: greedy or sampling; called once per step.
    cache: Use the key/value cache.
    timestamps: Also return the wall time (`tf.timestamp`) after each step (for the benchmark).

  Returns:
    int32 [b, num_new_tokens] (and float64 [steps] timestamps if asked).
  """
  prompt_length = prompts.shape[1]
  total = prompt_length + num_new_tokens
  buffer = tf.pad(prompts, [[0, 0], [0, num_new_tokens]])
  start = tf.reduce_min(lengths) - 1
  batch = tf.shape(prompts)[0]
  kv = model.prefill(prompts, total)[1] if cache else []
  times = tf.TensorArray(tf.float64, size=0, dynamic_size=True)

  def body(t, buffer, finished, kv, times):
    if cache:
      logits, kv = model.step(buffer[:, t], t, kv)
    else:
      logits = model(buffer[:, : t + 1])[:, -1]
    chosen = choose(logits)
    forced = t + 1 < lengths
    token = tf.where(forced, buffer[:, t + 1], tf.where(finished, PAD_ID, chosen))
    finished = finished | (~forced & tf.equal(chosen, BOS_ID))
    buffer = tf.where(tf.equal(tf.range(total), t + 1)[None, :], token[:, None], buffer)
    if timestamps:
      with tf.control_dependencies([token]):
        times = times.write(t - start, tf.timestamp())
    return t + 1, buffer, finished, kv, times

  _, buffer, _, _, times = tf.while_loop(
    lambda t, *_: t < total - 1,
    body,
    (start, buffer, tf.zeros([batch], tf.bool), kv, times),
    parallel_iterations=1,
  )
  index = lengths[:, None] + tf.range(num_new_tokens)[None, :]
  out = tf.gather(buffer, index, batch_dims=1)
  return (out, times.stack()) if timestamps else out


def sampler(
  generator: tf.random.Generator, greedy: tf.Tensor, temperature: float, top_k: int
) -> Callable[[tf.Tensor], tf.Tensor]:
  """A `choose` function for `generate`: argmax where `greedy` [b] is true, else a sample.

  Samples are drawn by the Gumbel-max trick from `generator` (one uniform
  draw of [b, vocab] per step, for every row), restricted to the `top_k`
  most likely tokens (0: all) at `temperature`. Padding is never chosen.
  """

  def choose(logits):
    vocab = logits.shape[-1]
    logits = tf.where(tf.equal(tf.range(vocab), PAD_ID)[None, :], tf.constant(-1e9, logits.dtype), logits)
    best = tf.argmax(logits, -1, output_type=tf.int32)
    scaled = logits / temperature
    if 0 < top_k < vocab:
      kth = tf.math.top_k(logits, top_k).values[:, -1:]
      scaled = tf.where(logits >= kth, scaled, tf.constant(-1e9, scaled.dtype))
    uniform = generator.uniform(tf.shape(logits), minval=1e-9, maxval=1.0, dtype=tf.float32)
    sampled = tf.argmax(scaled - tf.math.log(-tf.math.log(uniform)), -1, output_type=tf.int32)
    return tf.where(greedy, best, sampled)

  return choose
