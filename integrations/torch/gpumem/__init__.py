"""gpumem: a GPU device-memory manager (C11). This package holds its Python integrations.

``gpumem.torch`` makes gpumem PyTorch's CUDA allocator (docs/torch.md). It is imported on its
own (``import gpumem.torch``), so importing ``gpumem`` never imports PyTorch.
"""

__all__ = ["torch"]
