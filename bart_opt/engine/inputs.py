"""Input validation and the small tensor helpers shared by forward and generate."""

from __future__ import annotations

import torch


def check_inputs(model, input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate encoder inputs against `model`'s config; return them as tensors on its device.

    Raises `ValueError` naming the problem: wrong rank, empty batch, too many positions,
    ids outside the vocabulary, a mask whose shape differs from the ids, a row with no tokens.
    """
    ids = torch.as_tensor(input_ids, device=model.device)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, length); got shape {tuple(ids.shape)}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be integer token ids; got dtype {ids.dtype}")
    batch, length = ids.shape
    if batch == 0 or length == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(ids.shape)}): nothing to encode")
    max_pos = model.config.max_position_embeddings
    if length > max_pos:
        raise ValueError(
            f"input_ids has {length} positions but the model has only {max_pos} (max_position_embeddings); "
            "truncate the input"
        )
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"input_ids contains ids outside the vocabulary [0, {vocab})")
    if attention_mask is None:
        return ids.long(), None
    mask = torch.as_tensor(attention_mask, device=model.device)
    if mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)} but input_ids has shape {tuple(ids.shape)}; they must match"
        )
    empty_rows = (mask == 0).all(dim=1).nonzero().flatten().tolist()
    if empty_rows:
        raise ValueError(f"attention_mask rows {empty_rows} have no tokens: every input needs at least one")
    return ids.long(), mask


def shift_right(ids: torch.Tensor, pad_id: int, start_id: int) -> torch.Tensor:
    """(B, T) -> (B, T): prepend `start_id`, drop the last token; -100 labels become pad."""
    out = ids.new_empty(ids.shape)
    out[:, 0] = start_id
    out[:, 1:] = ids[:, :-1]
    return out.masked_fill_(out == -100, pad_id)
