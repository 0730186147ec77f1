"""The loss weights of a joined stream that corrects its late labels (`--late-labels correct`).

With a wait window W, an impression is emitted once, as a positive if its click came
within W and as a negative otherwise; a click that comes after W emits it again as a
positive (picasso.sample_join.join_state). So for an item with click probability p, of whose clicks
a share d arrive after W, the training stream holds, per impression:
    positives p(1 - d) + p·d = p, negatives (1 - p) + p·d, in all 1 + p·d samples;
that is, a biased distribution q(y=1|x) = p / (1 + p·d), q(y=0|x) = (1 - p + p·d) / (1 + p·d).
Weighting each sample by p(y|x) / q(y|x) makes the loss unbiased again:
    positive:  w = 1 + p·d
    negative:  w = (1 - p)(1 + p·d) / (1 - p + p·d)
These are the importance weights of ES-DFM (Yang et al., "Capturing Delayed Feedback in
Conversion Rate Prediction via Elapsed-Time Sampling", AAAI 2021), whose p·d is the
delayed-positive probability p_dp(x). ES-DFM learns p_dp with an auxiliary model; here it
is f(x)·d̂: the model's own prediction f(x) (without its gradient, as in the paper) times
d̂, the share of clicks the join saw arrive after W. With W = 0 every click is late
(d̂ = 1) and the weights are those of fake negative weighting (Ktena et al., "Addressing
Delayed Feedback for Continuous Training with Neural Networks in CTR prediction", RecSys
2019).
"""

from __future__ import annotations

import torch


def late_share(positives: int, late_labels: int) -> float:
    """d̂: the share of clicks that came after W, from the join's counts."""
    clicks = positives + late_labels
    return late_labels / clicks if clicks else 0.0


def importance_weights(probabilities: torch.Tensor, labels: torch.Tensor, share: float) -> torch.Tensor:
    """Per-sample weights for predictions f(x) (detached) and 0/1 labels (see the module)."""
    f = probabilities.detach()
    delayed = f * share  # p_dp(x)
    negative = (1 - f) * (1 + delayed) / (1 - f + delayed).clamp_min(1e-6)
    return torch.where(labels > 0.5, 1 + delayed, negative)
