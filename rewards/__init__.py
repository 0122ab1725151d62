"""The reward-function library (installed as vlmrl.rewards; every file also loads by path).

Plain functions taking one :class:`vlmrl.batch.RewardSample` (vlmrl's signature), meant to be read and copied:

- ``format``: ``<think>``/``<answer>`` tags and ``\\boxed{}``; text helpers (``answer_span``, ``extract_boxed``)
- ``accuracy``: math answers (math-verify), multiple-choice letters, numbers with tolerance
- ``iou``: boxes in the response vs ground-truth boxes, resized <-> original coordinates
- ``similarity``: normalised exact match, token F1, ROUGE-L
- ``visual``: model-free colour/shape consistency with ``extra_info["objects"]`` or the image
- ``clip``: CLIPScore from a CLIP-style model in a local folder
- ``length``: DAPO overlong penalty
- ``recipes``: geo3k (0.9 accuracy + 0.1 format), grounding, text_visual (0.7 similarity + 0.3 visual)
- ``synthetic``: the quick-start task's reward
- ``model``: the reward model's score (``reward_model.enable``) as a component

Their registry names (``reward.function=NAME``) are listed by ``vlmrl.scoring.registered_names()``.
"""
