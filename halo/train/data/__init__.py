"""Data in, batches out. All but batching run without torch (a login node's --dry-run view).

formats    dataset rows in the common formats -> chats, preference pairs, rewarded groups
tokenizer  Hugging Face tokenizers, chat templates, the loss mask from assistant spans
examples   JSONL/Parquet files -> examples, through a method's parse
s3data     s3:// datasets: a verified cache, usable offline
dataroot   $HALO_DATA_ROOT: what a run keeps beside its checkpoints
batching   the training set, its batch order as a function of (seed, epoch, step), tensors
"""
