"""OneCycleLR sized in batches (`epochs * len(loader)`) and stepped after every optimizer step."""
# expect: none

import torch
from torch.optim.lr_scheduler import OneCycleLR


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = OneCycleLR(opt, max_lr=1e-2, epochs=epochs, steps_per_epoch=len(train_loader))
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
    return sched.get_last_lr()
