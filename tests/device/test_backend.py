"""Backend selection and the in-place GEMM."""

import re

import numpy as np
import pytest

from summa.device.backend import NumpyBackend, get_backend, resolve_dtype, cupy_available


@pytest.mark.parametrize("name", ["float64", "float32", "float16", "complex128", "complex64"])
def test_resolve_dtype(name):
    assert resolve_dtype(name) == np.dtype(name)


@pytest.mark.parametrize("bad", ["int64", "bool", "object", "U3", "nonsense"])
def test_resolve_dtype_rejects(bad):
    with pytest.raises(ValueError, match="unsupported dtype"):
        resolve_dtype(bad)


def test_numpy_backend_refuses_float16():
    with pytest.raises(ValueError, match="not supported on the numpy backend"):
        NumpyBackend().check_dtype("float16")


def test_numpy_gemm_accumulates_in_place():
    rng = np.random.default_rng()
    a, b, c = rng.standard_normal((5, 3)), rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    c0 = c.copy()
    NumpyBackend().gemm(2.0, a, b, c)
    np.testing.assert_allclose(c, c0 + 2 * a @ b)
    NumpyBackend().gemm(1.0, a[:, :0], b[:0], c)  # empty inner dimension: no change
    np.testing.assert_allclose(c, c0 + 2 * a @ b)


def test_get_backend_choices():
    assert get_backend("numpy").name == "numpy"
    assert get_backend("auto").name == ("cupy" if cupy_available() else "numpy")
    with pytest.raises(ValueError, match="unknown backend"):
        get_backend("tpu")


def test_gemm_library_is_checked_on_every_machine(monkeypatch):
    from summa.device.backend import gemm_library
    assert gemm_library() in ("cublas", "cublaslt")
    monkeypatch.setenv("SUMMA_GEMM", " cuBLASLt ")
    assert gemm_library() == "cublaslt"
    monkeypatch.setenv("SUMMA_GEMM", "cublasxt")
    with pytest.raises(ValueError, match="SUMMA_GEMM='cublasxt' is not one of cublas, cublaslt"):
        get_backend("numpy")


def test_int8_library_takes_cublaslt_for_large_products_unless_told(monkeypatch):
    """SUMMA_INT8_GEMM: by default ("auto") cuBLASLt's timed choice from
    INT8_LT_MACS multiply-adds on, gemmEx below; "gemmex" always gemmEx;
    "cublaslt[:I]" from 2**30 on; anything else one clear error, on CPU
    machines too (get_backend)."""
    from summa.device.backend import INT8_LT_MACS, int8_library
    monkeypatch.delenv("SUMMA_INT8_GEMM", raising=False)
    assert int8_library(INT8_LT_MACS) == ("cublaslt", None, False)  # gemmEx where it cannot
    assert int8_library(INT8_LT_MACS - 1) == ("gemmex", None, False)
    monkeypatch.setenv("SUMMA_INT8_GEMM", " Auto ")
    assert int8_library(1 << 45) == ("cublaslt", None, False)
    monkeypatch.setenv("SUMMA_INT8_GEMM", "gemmex")
    assert int8_library(1 << 45) == ("gemmex", None, False)
    monkeypatch.setenv("SUMMA_INT8_GEMM", "cublaslt")
    assert int8_library(1 << 30) == ("cublaslt", None, True)  # asked: no fallback
    assert int8_library((1 << 30) - 1) == ("gemmex", None, False)
    monkeypatch.setenv("SUMMA_INT8_GEMM", "cublaslt:3")
    assert int8_library(1 << 31) == ("cublaslt", 3, True)
    for bad in ("cublas", "cublaslt:", "cublaslt:x", "auto:1", "gemmex:2"):
        monkeypatch.setenv("SUMMA_INT8_GEMM", bad)
        with pytest.raises(ValueError, match="SUMMA_INT8_GEMM must be one of auto, gemmex, "
                                             "cublaslt, cublaslt:I"):
            get_backend("numpy")


@pytest.mark.parametrize("text,reason", [("abc", "moduli must be an integer"),
                                         ("16.5", "moduli must be an integer"),
                                         ("2", "moduli must be 3-30"), ("31", "moduli must be 3-30")])
def test_moduli_setting_is_checked_before_any_product(monkeypatch, text, reason):
    """SUMMA_FP64_INT8_MODULI (the user's, or --moduli's): one clear error
    naming it from get_backend, on CPU machines too; good counts pass."""
    from summa.options import current
    monkeypatch.setenv("SUMMA_FP64_INT8_MODULI", text)
    with pytest.raises(ValueError, match=f"SUMMA_FP64_INT8_MODULI='{re.escape(text)}': {reason}"):
        get_backend("numpy")
    monkeypatch.setenv("SUMMA_FP64_INT8_MODULI", " 16 ")
    assert current().fp64_int8_moduli == 16 and get_backend("numpy").name == "numpy"
    monkeypatch.delenv("SUMMA_FP64_INT8_MODULI")
    assert current().fp64_int8_moduli is None


def test_chosen_cublaslt_file_must_exist(monkeypatch, tmp_path):
    from summa.device.backend import gemm_library
    monkeypatch.setenv("SUMMA_GEMM", "cublaslt")
    monkeypatch.setenv("SUMMA_CUBLASLT", str(tmp_path / "libcublasLt.so.12"))
    with pytest.raises(ValueError, match="SUMMA_CUBLASLT=.*libcublasLt.so.12' is not a file"):
        get_backend("numpy")
    (tmp_path / "libcublasLt.so.12").write_bytes(b"")
    assert gemm_library() == "cublaslt"


def test_chosen_cublaslt_file_that_is_no_library_is_a_usage_error(tmp_path):
    # The GPU backend loads the file when it is made; a ValueError becomes the
    # one-line exit-2 message every entry point gives (agree_backend).
    from summa.device.lt import _library
    bogus = tmp_path / "libcublasLt.so.13"
    bogus.write_text("not a shared object")
    with pytest.raises(ValueError, match="SUMMA_CUBLASLT=.*libcublasLt.so.13' cannot be loaded"):
        _library(None, str(bogus))


def test_compute_priority_is_checked_on_every_machine(monkeypatch):
    from summa.device.backend import compute_priority
    monkeypatch.setenv("SUMMA_COMPUTE_PRIORITY", "HIGH")
    assert compute_priority() == "high"
    assert get_backend("numpy").name == "numpy"  # no streams on the host: accepted, no effect
    monkeypatch.setenv("SUMMA_COMPUTE_PRIORITY", "urgent")
    with pytest.raises(ValueError, match="SUMMA_COMPUTE_PRIORITY='urgent' is not one of"):
        get_backend("numpy")


@pytest.mark.skipif(cupy_available(), reason="only meaningful without a GPU")
def test_cupy_requested_without_gpu():
    with pytest.raises(ValueError, match="CuPy is not installed or sees no GPU"):
        get_backend("cupy")


def test_share_cpu_cores(monkeypatch):
    import os
    from summa.device.backend import share_cpu_cores
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    from threadpoolctl import threadpool_info, threadpool_limits
    with threadpool_limits(limits=None):  # restore whatever was there afterwards
        share = share_cpu_cores(2)
        assert share == max(1, (os.cpu_count() or 1) // 2)
        assert all(p["num_threads"] <= share for p in threadpool_info() if p["user_api"] == "blas")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert share_cpu_cores(2) is None  # the user's setting wins


def test_cublaslt_alignment_of_pointers():
    # cuBLASLt assumes 256-byte aligned operands unless told: panels and strips
    # start anywhere, so the preference must state what a pointer really has.
    from summa.device.lt import _alignment
    assert _alignment(0x7F0000000000) == 256
    assert _alignment(0x7F0000000000 + 8 * 4096) == 256
    assert _alignment(0x7F0000000000 + 8) == 8
    assert _alignment(0x7F0000000000 + 48) == 16
    assert _alignment(0x7F0000000000 + 3) == 1


def test_gemm_output_may_be_a_column_strip_but_not_transposed():
    from summa.device.cupy_backend import _output_ld
    c = np.zeros((6, 10))
    assert _output_ld(c) == 10
    assert _output_ld(c[:, 3:7]) == 10  # a column strip: rows 10 apart
    assert _output_ld(c[::2]) == 20
    assert _output_ld(c[:1, 2:5]) == 3  # one row: any leading dimension >= its length
    with pytest.raises(ValueError, match="unit stride along its rows"):
        _output_ld(c.T)
    with pytest.raises(ValueError, match="unit stride along its rows"):
        _output_ld(c[:, ::2])


def test_cublaslt_int8_choices_are_remembered_across_processes(tmp_path, monkeypatch):
    """The INT8 algorithm timed on a product's shape is kept in
    SUMMA_CACHE_DIR (or ~/.cache/summa) for later processes; an unreadable
    or foreign file is no choice, a read-only place keeps nothing, silently."""
    from summa.device import lt
    monkeypatch.setenv("SUMMA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(lt, "_cache_key", lambda gemm, key: f"gpu|13|8|{key[1:5]}")
    key = ("int8 TN", 64, 32, 128, (256,) * 4, None, 0.0)
    assert lt._remembered(None, key) is None
    lt._remember(None, key, 3)
    lt._remember(None, ("int8 TN", 8, 8, 8, (16,) * 4, None, 0.0), 1)
    assert lt._remembered(None, key) == 3
    (tmp_path / "cache" / "cublaslt-int8.json").write_text("{not json")
    assert lt._remembered(None, key) is None
    monkeypatch.setenv("SUMMA_CACHE_DIR", "/proc/summa-cannot-write-here")
    lt._remember(None, key, 2)  # no error
    assert lt._remembered(None, key) is None
