//! A GGUF file's header (metadata and tensor table) read through ggml's own `gguf` API.
#![allow(unsafe_code, reason = "ggml's gguf API is C; this module is its safe wrapper")]

use std::path::Path;

/// A GGUF file's metadata, read by ggml without its tensor data. `llama-cpp-2`'s `GgufContext`
/// has no array lengths (the vocabulary size is one), hence this small wrapper.
pub(crate) struct Header(std::ptr::NonNull<llama_cpp_sys_2::gguf_context>);

/// A GGUF's tensor table as ggml tensors without data, for their shapes (ggml's `gguf` API has
/// none).
pub(crate) struct Shapes(std::ptr::NonNull<llama_cpp_sys_2::ggml_context>);

impl Header {
    pub(crate) fn open(path: &Path) -> Option<Self> {
        Self::read(path, std::ptr::null_mut())
    }

    /// The header and its tensors' shapes.
    pub(crate) fn open_with_shapes(path: &Path) -> Option<(Self, Shapes)> {
        let mut ctx = std::ptr::null_mut();
        let header = Self::read(path, &mut ctx)?;
        Some((header, Shapes(std::ptr::NonNull::new(ctx)?)))
    }

    fn read(path: &Path, ctx: *mut *mut llama_cpp_sys_2::ggml_context) -> Option<Self> {
        let c_path = std::ffi::CString::new(path.to_str()?).ok()?;
        let params = llama_cpp_sys_2::gguf_init_params { no_alloc: true, ctx };
        // SAFETY: a valid C string and a null or writable context pointer; ggml returns null on
        // any failure (and then leaves no context behind).
        std::ptr::NonNull::new(unsafe { llama_cpp_sys_2::gguf_init_from_file(c_path.as_ptr(), params) }).map(Self)
    }

    /// The key's index when it holds a value of type `ty` (ggml aborts on a mismatched read).
    fn find(&self, key: &str, ty: llama_cpp_sys_2::gguf_type) -> Option<i64> {
        let c_key = std::ffi::CString::new(key).ok()?;
        // SAFETY: the context lives as long as `self`; the index is checked before use.
        unsafe {
            let idx = llama_cpp_sys_2::gguf_find_key(self.0.as_ptr(), c_key.as_ptr());
            (idx >= 0 && llama_cpp_sys_2::gguf_get_kv_type(self.0.as_ptr(), idx) == ty).then_some(idx)
        }
    }

    pub(crate) fn u32(&self, key: &str) -> Option<u32> {
        let idx = self.find(key, llama_cpp_sys_2::GGUF_TYPE_UINT32)?;
        // SAFETY: `find` checked the type.
        Some(unsafe { llama_cpp_sys_2::gguf_get_val_u32(self.0.as_ptr(), idx) })
    }

    pub(crate) fn string(&self, key: &str) -> Option<String> {
        let idx = self.find(key, llama_cpp_sys_2::GGUF_TYPE_STRING)?;
        // SAFETY: `find` checked the type; ggml owns the string while the context lives.
        let ptr = unsafe { llama_cpp_sys_2::gguf_get_val_str(self.0.as_ptr(), idx) };
        // SAFETY: not null, and a NUL-terminated string ggml keeps while the context lives.
        (!ptr.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
    }

    pub(crate) fn array_len(&self, key: &str) -> Option<u64> {
        let idx = self.find(key, llama_cpp_sys_2::GGUF_TYPE_ARRAY)?;
        // SAFETY: `find` checked the type.
        Some(unsafe { llama_cpp_sys_2::gguf_get_arr_n(self.0.as_ptr(), idx) } as u64)
    }

    /// Tensors in the file's table, in the order their data follows one another.
    pub(crate) fn n_tensors(&self) -> i64 {
        // SAFETY: the context lives as long as `self`.
        unsafe { llama_cpp_sys_2::gguf_get_n_tensors(self.0.as_ptr()) }
    }

    pub(crate) fn tensor_name(&self, id: i64) -> String {
        // SAFETY: ids come from `0..n_tensors()`; ggml owns the name while the context lives.
        let ptr = unsafe { llama_cpp_sys_2::gguf_get_tensor_name(self.0.as_ptr(), id) };
        // SAFETY: ggml returns a NUL-terminated name for every id in range.
        unsafe { std::ffi::CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    pub(crate) fn tensor_type(&self, id: i64) -> llama_cpp_sys_2::ggml_type {
        // SAFETY: ids come from `0..n_tensors()`.
        unsafe { llama_cpp_sys_2::gguf_get_tensor_type(self.0.as_ptr(), id) }
    }

    /// The tensors a forward pass multiplies by: all but the token embedding, which is only
    /// looked up (one row a token) unless the model has no `output.weight` and its output layer
    /// multiplies by the embedding too.
    pub(crate) fn multiplied_tensors(&self) -> Vec<i64> {
        let names: Vec<String> = (0..self.n_tensors()).map(|id| self.tensor_name(id)).collect();
        let tied_output = !names.iter().any(|n| n == "output.weight");
        (0..self.n_tensors())
            .zip(names)
            .filter(|(_, name)| tied_output || name != "token_embd.weight")
            .map(|(id, _)| id)
            .collect()
    }

    /// Where the tensor's data starts in the data section, and its length in bytes, as the
    /// table says now (after `set_tensor_type`, as the file would be written).
    pub(crate) fn tensor_in_data(&self, id: i64) -> (u64, u64) {
        // SAFETY: ids come from `0..n_tensors()`.
        unsafe {
            let offset = llama_cpp_sys_2::gguf_get_tensor_offset(self.0.as_ptr(), id);
            (offset as u64, llama_cpp_sys_2::gguf_get_tensor_size(self.0.as_ptr(), id) as u64)
        }
    }

    /// Where the tensor's data starts in the file that was read, and its length in bytes.
    pub(crate) fn tensor_span(&self, id: i64) -> (u64, u64) {
        // SAFETY: the context lives as long as `self`.
        let data = unsafe { llama_cpp_sys_2::gguf_get_data_offset(self.0.as_ptr()) } as u64;
        let (offset, len) = self.tensor_in_data(id);
        (data + offset, len)
    }

    /// Gives tensor `id` another type of the same block length (ggml moves the offsets of the
    /// tensors after it).
    pub(crate) fn set_tensor_type(&mut self, id: i64, ty: llama_cpp_sys_2::ggml_type) {
        let name = std::ffi::CString::new(self.tensor_name(id)).expect("ggml names hold no NUL");
        // SAFETY: the name is the tensor's own, so ggml finds it (it aborts otherwise); callers
        // only swap types of one block length, which ggml asserts.
        unsafe { llama_cpp_sys_2::gguf_set_tensor_type(self.0.as_ptr(), name.as_ptr(), ty) }
    }

    /// The header as ggml writes it: metadata, tensor table and the padding up to the data.
    pub(crate) fn meta_bytes(&self) -> Vec<u8> {
        // SAFETY: the buffer holds the size ggml reports for the same context.
        unsafe {
            let mut buf = vec![0u8; llama_cpp_sys_2::gguf_get_meta_size(self.0.as_ptr())];
            llama_cpp_sys_2::gguf_get_meta_data(self.0.as_ptr(), buf.as_mut_ptr().cast());
            buf
        }
    }
}

impl Shapes {
    /// The dimensions the tensor named `name` has (ggml's `n_dims`: trailing ones not counted);
    /// 0 for a name the file does not hold.
    pub(crate) fn dims(&self, name: &str) -> usize {
        let Ok(c_name) = std::ffi::CString::new(name) else { return 0 };
        // SAFETY: the context lives as long as `self`; ggml returns null for an unknown name.
        unsafe {
            let tensor = llama_cpp_sys_2::ggml_get_tensor(self.0.as_ptr(), c_name.as_ptr());
            if tensor.is_null() {
                0
            } else {
                usize::try_from(llama_cpp_sys_2::ggml_n_dims(tensor)).unwrap_or(0)
            }
        }
    }
}

impl Drop for Shapes {
    fn drop(&mut self) {
        // SAFETY: created by `gguf_init_from_file`, freed once.
        unsafe { llama_cpp_sys_2::ggml_free(self.0.as_ptr()) }
    }
}

impl Drop for Header {
    fn drop(&mut self) {
        // SAFETY: created by `gguf_init_from_file`, freed once.
        unsafe { llama_cpp_sys_2::gguf_free(self.0.as_ptr()) }
    }
}
