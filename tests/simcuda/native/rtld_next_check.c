#include <stdio.h>
int main(void) {
    puts("rtld-next-ok");
    return 0;
}
