"""OneCycleLR(epochs=epochs, steps_per_epoch=1) stepped every batch."""

# expect: fit_raised, scheduler_wrong_rate
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    s = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=epochs, steps_per_epoch=1)
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            s.step()
