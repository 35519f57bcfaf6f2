/*
 * The one intrusive doubly linked list: a head pointer (NULL = empty) and a node's prev/next
 * links, named by the caller (a block is on its strategy's free list through free_prev /
 * free_next, a span on its arena's through prev / next). Macros, not functions, so that one
 * definition serves every node type and expands to the same code as the hand-written lists it
 * replaced. `head` is an lvalue, evaluated more than once: no side effects in it.
 *
 * Lists kept apart on purpose: tlsf's and the cache's free lists (the hot paths: each keeps the
 * list head in a register it also uses for the class bitmap, or keeps a tail too), the pending
 * list and the spare records (singly linked), and the VMM page lists (32-bit indices into the
 * page table, not pointers).
 */
#ifndef GM_LIST_H
#define GM_LIST_H

#include <stddef.h>

/* Put node n first on the list `head`. */
#define LIST_PUSH(head, n, prev, next)                                                        \
    do {                                                                                      \
        (n)->prev = NULL;                                                                     \
        (n)->next = (head);                                                                   \
        if (head)                                                                             \
            (head)->prev = (n);                                                               \
        (head) = (n);                                                                         \
    } while (0)

/* Take node n off the list `head` (its own links are left as they were). */
#define LIST_UNLINK(head, n, prev, next)                                                      \
    do {                                                                                      \
        if ((n)->prev)                                                                        \
            (n)->prev->next = (n)->next;                                                      \
        else                                                                                  \
            (head) = (n)->next;                                                               \
        if ((n)->next)                                                                        \
            (n)->next->prev = (n)->prev;                                                      \
    } while (0)

/* LIST_UNLINK, and n's links cleared. */
#define LIST_REMOVE(head, n, prev, next)                                                      \
    do {                                                                                      \
        LIST_UNLINK(head, n, prev, next);                                                     \
        (n)->prev = (n)->next = NULL;                                                         \
    } while (0)

#endif
