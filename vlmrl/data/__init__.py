"""vlmrl.data: verl-schema parquet → ``PromptSample`` (chat with image parts, prompt ids with one image pad per image,
images resized once with Qwen's rules), decoded lazily; and a resumable, epoch-aware batch sampler.

    from vlmrl.data import RLDataset, BatchSampler
    ds = RLDataset(cfg.data.train_files, processor, cfg.data, split="train")
    sampler = BatchSampler(len(ds), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed, drop_last=True)
    for indices in sampler:
        prompts = ds.get_batch(indices)
"""

from vlmrl.data.dataset import RLDataset, normalize_files
from vlmrl.data.records import DataError, build_messages, split_placeholders
from vlmrl.data.sampler import BatchSampler
from vlmrl.data.template import ChatRenderer

__all__ = [
    "BatchSampler",
    "ChatRenderer",
    "DataError",
    "RLDataset",
    "build_messages",
    "normalize_files",
    "split_placeholders",
]
