//! Pointer queries: what memory an address is (device memory of which device, page-locked host
//! memory, or unknown to the driver), its allocation or mapped piece, whether it is mapped.
//! Every device buffer a call is given is asked here before anything is copied or launched.

use std::ffi::{c_int, c_uint, c_void};

use super::{DevicePtr, Driver};

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (answers a `CUmemorytype`).
pub const POINTER_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (answers an `int`).
pub const POINTER_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (answers a `CUdeviceptr`): the start of the
/// allocation, or of the reserved range (`cuMemAddressReserve`) of memory mapped with `cuMemMap`.
pub const POINTER_RANGE_START: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE` (answers a `size_t`), of the same range.
pub const POINTER_RANGE_SIZE: c_int = 12;
/// `CU_POINTER_ATTRIBUTE_MAPPED` (answers a boolean, 32 bits): whether the address is mapped to
/// memory.
pub const POINTER_MAPPED: c_int = 13;
/// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`: memory of `cuMemAlloc` (which peer access
/// and CUDA IPC cover), not of a pool or mapped with `cuMemMap`.
pub const POINTER_LEGACY_IPC: c_int = 10;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEMORYTYPE_HOST`: page-locked host memory the driver knows (`cuMemAllocHost`,
/// `cuMemHostAlloc`, `cuMemHostRegister`).
pub const MEMORYTYPE_HOST: c_uint = 1;

/// Device memory as the driver tells it ([`Driver::pointer_facts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerFacts {
    /// The device ordinal owning the memory.
    pub device: u32,
    /// Memory of `cuMemAlloc`: its allocation's start and size. `None` for other device
    /// memory (mapped piece by piece with `cuMemMap`, or of a stream-ordered pool).
    pub allocation: Option<(DevicePtr, usize)>,
}

impl Driver {
    /// What the driver knows of `ptr` in one query (`cuPointerGetAttributes`): `None` for
    /// host memory and for addresses the driver never allocated; for device memory, its
    /// device and, where it is memory of `cuMemAlloc`, the whole allocation. Tells a host
    /// pointer passed where a device pointer is expected (and the reverse) before any copy; a
    /// buffer inside one allocation needs nothing more (a collective asks this of each of its
    /// buffers on every call).
    pub fn pointer_facts(&self, ptr: DevicePtr) -> Option<PointerFacts> {
        let (mut kind, mut ordinal, mut plain): (c_uint, c_int, c_uint) = (0, -1, 0);
        let (mut start, mut size): (DevicePtr, usize) = (0, 0);
        let mut attrs = [
            POINTER_MEMORY_TYPE,
            POINTER_DEVICE_ORDINAL,
            POINTER_LEGACY_IPC,
            POINTER_RANGE_START,
            POINTER_RANGE_SIZE,
        ];
        let mut data: [*mut c_void; 5] = [
            (&mut kind as *mut c_uint).cast(),
            (&mut ordinal as *mut c_int).cast(),
            (&mut plain as *mut c_uint).cast(),
            (&mut start as *mut DevicePtr).cast(),
            (&mut size as *mut usize).cast(),
        ];
        // SAFETY: `data[i]` is a valid out-pointer of attribute `attrs[i]`'s type (CUmemorytype
        // and the boolean: 32 bits; int; CUdeviceptr; size_t), both arrays hold as many entries
        // as passed; the driver only looks the address up, it never dereferences it.
        let s = unsafe {
            (self.pointer_attributes)(
                attrs.len() as c_uint,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr,
            )
        };
        if s != 0 {
            // A driver that refuses one of the attributes: the memory type and the device one
            // at a time, and no allocation (the caller then asks for the mapped piece).
            return self.device_of_pointer(ptr).map(|device| PointerFacts {
                device,
                allocation: None,
            });
        }
        (kind == MEMORYTYPE_DEVICE && ordinal >= 0).then(|| PointerFacts {
            device: ordinal as u32,
            allocation: (plain != 0 && size > 0).then_some((start, size)),
        })
    }

    /// The device ordinal that owns `ptr` if it is device memory the driver knows, asked one
    /// attribute at a time (`None` for host memory and addresses the driver never allocated).
    fn device_of_pointer(&self, ptr: DevicePtr) -> Option<u32> {
        if self.memory_type(ptr) != Some(MEMORYTYPE_DEVICE) {
            return None;
        }
        let mut ordinal: c_int = -1;
        // SAFETY: `ordinal` is a valid out-pointer of the attribute's type (int); the driver
        // only looks the address up.
        let s = unsafe {
            (self.pointer_attribute)(
                (&mut ordinal as *mut c_int).cast(),
                POINTER_DEVICE_ORDINAL,
                ptr,
            )
        };
        (s == 0 && ordinal >= 0).then_some(ordinal as u32)
    }

    /// The address range holding device pointer `ptr`, its start and size: the allocation
    /// (`cuMemAlloc`), or for memory mapped piece by piece (`cuMemMap`) the whole reserved range
    /// (`cuMemAddressReserve`), mapped or not. `None`: not an address the driver knows.
    pub fn allocation_of_pointer(&self, ptr: DevicePtr) -> Option<(DevicePtr, usize)> {
        let mut start: DevicePtr = 0;
        let mut size: usize = 0;
        // SAFETY: valid out-pointers of the attributes' types (CUdeviceptr, size_t); the
        // driver only looks the address up.
        let s = unsafe {
            (self.pointer_attribute)(
                (&mut start as *mut DevicePtr).cast(),
                POINTER_RANGE_START,
                ptr,
            )
        };
        if s != 0 {
            return None;
        }
        // SAFETY: as above.
        let s = unsafe {
            (self.pointer_attribute)((&mut size as *mut usize).cast(), POINTER_RANGE_SIZE, ptr)
        };
        (s == 0).then_some((start, size))
    }

    /// Whether `ptr` is page-locked host memory the driver knows (`cuMemAllocHost`,
    /// `cuMemHostAlloc`, `cuMemHostRegister`); `false` for pageable host memory, which the
    /// driver does not know, and for device memory.
    pub fn is_page_locked_host(&self, ptr: DevicePtr) -> bool {
        self.memory_type(ptr) == Some(MEMORYTYPE_HOST)
    }

    /// The `CUmemorytype` of `ptr` (`None`: an address the driver does not know, such as
    /// pageable host memory).
    fn memory_type(&self, ptr: DevicePtr) -> Option<c_uint> {
        let mut kind: c_uint = 0;
        // SAFETY: `kind` is a valid out-pointer of the attribute's type (CUmemorytype, 32 bits);
        // the driver only looks the address up, it never dereferences it.
        let s = unsafe {
            (self.pointer_attribute)((&mut kind as *mut c_uint).cast(), POINTER_MEMORY_TYPE, ptr)
        };
        (s == 0).then_some(kind)
    }

    /// The mapped piece of memory holding device pointer `ptr` (`cuMemGetAddressRange`), its
    /// start and size: the whole allocation of `cuMemAlloc` memory; for memory mapped piece by
    /// piece into a reserved range (`cuMemMap`, as PyTorch's expandable segments), the one
    /// piece. `None`: not mapped memory the driver knows.
    pub fn mapping_of_pointer(&self, ptr: DevicePtr) -> Option<(DevicePtr, usize)> {
        let (mut start, mut size): (DevicePtr, usize) = (0, 0);
        // SAFETY: valid out-pointers of the function's types (CUdeviceptr, size_t); the driver
        // only looks the address up.
        let s = unsafe { (self.mem_get_address_range)(&mut start, &mut size, ptr) };
        (s == 0).then_some((start, size))
    }

    /// Whether device pointer `ptr` is mapped to memory (`None`: the driver did not answer).
    /// An address of a reserved range that is not mapped (yet) answers `false`.
    pub fn is_mapped(&self, ptr: DevicePtr) -> Option<bool> {
        let mut mapped: c_uint = 0;
        // SAFETY: a valid out-pointer of the attribute's type (a 32-bit boolean); the driver
        // only looks the address up.
        let s = unsafe {
            (self.pointer_attribute)((&mut mapped as *mut c_uint).cast(), POINTER_MAPPED, ptr)
        };
        (s == 0).then_some(mapped != 0)
    }

    /// Whether device pointer `ptr` is memory of `cuMemAlloc` (`None`: the driver did not
    /// answer). Peer access (`cuCtxEnablePeerAccess`) makes only such memory of another device
    /// reachable; memory of a pool or mapped with `cuMemMap` needs access granted of its own.
    pub fn is_plain_allocation(&self, ptr: DevicePtr) -> Option<bool> {
        let mut plain: c_uint = 0;
        // SAFETY: a valid out-pointer of the attribute's type (a 32-bit boolean); the driver
        // only looks the address up.
        let s = unsafe {
            (self.pointer_attribute)((&mut plain as *mut c_uint).cast(), POINTER_LEGACY_IPC, ptr)
        };
        (s == 0).then_some(plain != 0)
    }
}
