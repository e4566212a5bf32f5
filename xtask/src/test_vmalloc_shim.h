/* vmtrace's shim for building lib/test_vmalloc.c out of tree: __vmalloc_node_noprof is
 * exported only to an in-tree CONFIG_TEST_VMALLOC=m build, so its address is found through a
 * kprobe registration (register_kprobe resolves a symbol name) before the tests start. */
#include <linux/kprobes.h>
#include <linux/vmalloc.h>
static void *(*vmtrace_vmalloc_node_fn)(unsigned long, unsigned long, gfp_t, int, const void *);
#define vmtrace_vmalloc_node(size, align, gfp, node, caller) \
	vmtrace_vmalloc_node_fn(size, align, gfp, node, caller)
static int vmalloc_test_init(void);
static int __init vmtrace_shim_init(void)
{
	struct kprobe kp = { .symbol_name = "__vmalloc_node_noprof" };
	int err = register_kprobe(&kp);
	if (err)
		return err;
	vmtrace_vmalloc_node_fn = (void *)kp.addr;
	unregister_kprobe(&kp);
	return vmalloc_test_init();
}
