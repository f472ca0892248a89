/* An empty library named like PyTorch's libc10_cuda.so: a simulated PyTorch process maps
 * it before its first CUDA call, as a real one maps PyTorch's, so that the interposer's
 * framework attribution (which libraries the process loaded) can be tested without torch. */
int vramhook_sim_fake_c10_cuda;
