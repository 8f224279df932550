"""CosineAnnealingLR with `T_max=epochs`, stepped per batch: the schedule cycles within an epoch."""
# expect: scheduler_wrong_rate

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
