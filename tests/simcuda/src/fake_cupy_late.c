/* An empty library named like CuPy's, loaded by late_framework after its first CUDA call. */
__attribute__((visibility("default"))) int vramhook_sim_fake_cupy;
