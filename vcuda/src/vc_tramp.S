/* Pass-through entry points of the drop-in flavour: each jumps through its
 * slot of vc_tramp_table; an empty slot is filled on first use by
 * vc_tramp_resolve (argument registers saved around the call), so no symbol of
 * the real driver is looked up before it is needed. */
#if defined(__x86_64__)

    .text
    .hidden vc_tramp_table
    .hidden vc_tramp_resolve

    .macro VC_TRAMP name, idx
    .globl \name
    .type \name, @function
    .p2align 4
\name:
    movq vc_tramp_table+8*\idx(%rip), %r11
    testq %r11, %r11
    jz 1f
    jmp *%r11
1:  movl $\idx, %r11d
    jmp vc_tramp_slow
    .size \name, .-\name
    .endm

    .p2align 4
    .type vc_tramp_slow, @function
vc_tramp_slow:
    pushq %rbp
    movq %rsp, %rbp
    subq $192, %rsp
    movq %rdi, 0(%rsp)
    movq %rsi, 8(%rsp)
    movq %rdx, 16(%rsp)
    movq %rcx, 24(%rsp)
    movq %r8, 32(%rsp)
    movq %r9, 40(%rsp)
    movq %rax, 48(%rsp)
    movdqu %xmm0, 64(%rsp)
    movdqu %xmm1, 80(%rsp)
    movdqu %xmm2, 96(%rsp)
    movdqu %xmm3, 112(%rsp)
    movdqu %xmm4, 128(%rsp)
    movdqu %xmm5, 144(%rsp)
    movdqu %xmm6, 160(%rsp)
    movdqu %xmm7, 176(%rsp)
    movl %r11d, %edi
    call vc_tramp_resolve
    movq %rax, %r11
    movq 0(%rsp), %rdi
    movq 8(%rsp), %rsi
    movq 16(%rsp), %rdx
    movq 24(%rsp), %rcx
    movq 32(%rsp), %r8
    movq 40(%rsp), %r9
    movq 48(%rsp), %rax
    movdqu 64(%rsp), %xmm0
    movdqu 80(%rsp), %xmm1
    movdqu 96(%rsp), %xmm2
    movdqu 112(%rsp), %xmm3
    movdqu 128(%rsp), %xmm4
    movdqu 144(%rsp), %xmm5
    movdqu 160(%rsp), %xmm6
    movdqu 176(%rsp), %xmm7
    leave
    jmp *%r11
    .size vc_tramp_slow, .-vc_tramp_slow

#elif defined(__aarch64__)
/* Not exercised by the test suite (it runs on x86_64). */
    .text
    .hidden vc_tramp_table
    .hidden vc_tramp_resolve

    .macro VC_TRAMP name, idx
    .globl \name
    .type \name, %function
    .p2align 4
\name:
    adrp x16, vc_tramp_table
    add x16, x16, :lo12:vc_tramp_table
    ldr x17, [x16, #(8*\idx)]
    cbz x17, 1f
    br x17
1:  mov x16, #\idx
    b vc_tramp_slow
    .size \name, .-\name
    .endm

    .p2align 4
    .type vc_tramp_slow, %function
vc_tramp_slow:
    stp x29, x30, [sp, #-224]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    str x8, [sp, #80]
    stp q0, q1, [sp, #96]
    stp q2, q3, [sp, #128]
    stp q4, q5, [sp, #160]
    stp q6, q7, [sp, #192]
    mov x0, x16
    bl vc_tramp_resolve
    mov x16, x0
    ldp x0, x1, [sp, #16]
    ldp x2, x3, [sp, #32]
    ldp x4, x5, [sp, #48]
    ldp x6, x7, [sp, #64]
    ldr x8, [sp, #80]
    ldp q0, q1, [sp, #96]
    ldp q2, q3, [sp, #128]
    ldp q4, q5, [sp, #160]
    ldp q6, q7, [sp, #192]
    ldp x29, x30, [sp], #224
    br x16
    .size vc_tramp_slow, .-vc_tramp_slow

#else
#error "the drop-in flavour's trampolines exist for x86_64 and aarch64 only"
#endif

#define VC_SURFACE(name) VC_TRAMP name, __COUNTER__
#include "vc_surface_cuda.inc"
#include "vc_surface_nvml.inc"

    .section .note.GNU-stack, "", %progbits
