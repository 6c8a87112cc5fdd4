"""The hook PyTorch calls at ``import torch``: routing on when ``UNIMATMUL_TORCH=1``.

Registered under PyTorch's ``torch.backends`` entry-point group (PyTorch's device
extension autoloading, on unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so a program
that never imports unimatmul is routed all the same. Without the variable the hook
returns at once and imports nothing of unimatmul.torch's routing.
"""

from __future__ import annotations

from unimatmul import settings

ENV = settings.TORCH.name


def wanted() -> bool:
    return settings.TORCH.get()


def load() -> None:
    """Called by ``import torch`` (near the end of its own initialisation).

    Never raises: PyTorch would turn an exception here into a failed ``import torch``.
    """
    if not wanted():
        return
    try:
        from unimatmul.torch import enable

        enable()
    except Exception as exc:
        import warnings

        warnings.warn(
            f"unimatmul: {ENV}=1 but routing could not be enabled: {exc!r}", RuntimeWarning, stacklevel=2
        )
