"""Data: tokenizers, the embedded corpus, parquet/TFDS readers, the grain packing pipeline.

  tokenizer.get_tokenizer(name)                       'gpt2' | 'byte'
  pipeline.make_train_iterator(config, pi, pc)        -> iterator of {'tokens': int32 [B, T+1]}
  pipeline.make_val_batches(config, pi, pc)           -> list of the same
  pipeline.iterator_save_args / iterator_restore_args orbax args for the iterator state
"""
