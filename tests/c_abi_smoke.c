/* The C ABI from plain C99: every family header compiles as C, and an error path works
 * without a GPU (a dtype mismatch is reported before any device access). */
#include <stdio.h>
#include <string.h>

#include "tessel/tessel.h"

int main(void) {
  int64_t shape[2] = {4, 8};
  tessel_tensor_t x, y;
  if (tessel_tensor_init(&x, (void*)0x1000, TESSEL_F32, 2, shape) != TESSEL_OK) return 1;
  if (tessel_tensor_init(&y, (void*)0x2000, TESSEL_BF16, 2, shape) != TESSEL_OK) return 1;
  tessel_status_t s = tessel_softmax(&x, &y, NULL);
  if (s != TESSEL_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "expected invalid argument, got %s\n", tessel_status_string(s));
    return 1;
  }
  if (strstr(tessel_last_error(), "tessel::softmax") == NULL) return 1;
  printf("c abi ok: %s\n", tessel_last_error());
  return 0;
}
