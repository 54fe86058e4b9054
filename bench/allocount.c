/* Counts the interpreter's allocations: every PyObject_Malloc/Calloc/Realloc/Free and
 * PyMem_Malloc/... (the object and "mem" domains, where every Python object and every
 * list's or dict's storage comes from) while counting is on.
 *
 * bench/allocs.py compiles it (cc -shared) and loads it with ctypes.PyDLL, which keeps
 * the GIL held across calls, as PyMem_SetAllocator and the hooks need. Net counts
 * (sys.getallocatedblocks, tracemalloc) see only what stays allocated; an object made
 * and freed within a call, which still moves the collector's young-generation counter
 * and costs CPU, shows only here.
 */
#include <Python.h>

static PyMemAllocatorEx original_obj, original_mem;
static int installed = 0;
static int counting = 0;
static unsigned long long allocs = 0, reallocs = 0, frees = 0, bytes = 0;

#define HOOKS(domain)                                                                    \
    static void *domain##_malloc(void *ctx, size_t size) {                              \
        if (counting) {                                                                  \
            allocs++;                                                                    \
            bytes += size;                                                               \
        }                                                                                \
        return original_##domain.malloc(original_##domain.ctx, size);                    \
    }                                                                                    \
    static void *domain##_calloc(void *ctx, size_t nelem, size_t elsize) {              \
        if (counting) {                                                                  \
            allocs++;                                                                    \
            bytes += nelem * elsize;                                                     \
        }                                                                                \
        return original_##domain.calloc(original_##domain.ctx, nelem, elsize);           \
    }                                                                                    \
    static void *domain##_realloc(void *ctx, void *ptr, size_t size) {                  \
        if (counting) {                                                                  \
            if (ptr == NULL) {                                                           \
                allocs++;                                                                \
                bytes += size;                                                           \
            } else {                                                                     \
                reallocs++;                                                              \
            }                                                                            \
        }                                                                                \
        return original_##domain.realloc(original_##domain.ctx, ptr, size);              \
    }                                                                                    \
    static void domain##_free(void *ctx, void *ptr) {                                   \
        if (counting && ptr != NULL) {                                                   \
            frees++;                                                                     \
        }                                                                                \
        original_##domain.free(original_##domain.ctx, ptr);                              \
    }

HOOKS(obj)
HOOKS(mem)

void allocount_install(void) {
    if (installed) {
        return;
    }
    PyMemAllocatorEx obj = {NULL, obj_malloc, obj_calloc, obj_realloc, obj_free};
    PyMemAllocatorEx mem = {NULL, mem_malloc, mem_calloc, mem_realloc, mem_free};
    PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &original_obj);
    PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &original_mem);
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &obj);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &mem);
    installed = 1;
}

void allocount_uninstall(void) {
    if (!installed) {
        return;
    }
    counting = 0;
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &original_obj);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &original_mem);
    installed = 0;
}

void allocount_count(int on) { counting = on; }

unsigned long long allocount_allocs(void) { return allocs; }
unsigned long long allocount_reallocs(void) { return reallocs; }
unsigned long long allocount_frees(void) { return frees; }
unsigned long long allocount_bytes(void) { return bytes; }
